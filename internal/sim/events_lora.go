package sim

import (
	"hash/fnv"

	"github.com/kvgate/kvgate/internal/kvevents"
)

// An adapter's blocks in the KV events, as vLLM publishes them: each BlockStored of an
// adapter's prompt carries the adapter's id ("lora_id", a number the engine assigns) and name
// ("lora_name"), and the first block of a prompt lists the name among its extra keys (before a
// cache salt), as vLLM mixes both into that block's hash.

// StoredAdapter notes the adapter of the block stored next (engine.AdapterObserver).
func (c *cacheEvents) StoredAdapter(adapter string) { c.storedAdapter = adapter }

// withAdapter gives e, a new BlockStored, the adapter noted for it, and forgets the note.
func (c *cacheEvents) withAdapter(e *kvevents.Event) {
	a := c.storedAdapter
	c.storedAdapter = ""
	if a == "" {
		return
	}
	e.LoRAName, e.LoRA, e.HasLoRA = a, adapterID(a), true
	if !e.HasParent {
		e.ExtraKeys = append(e.ExtraKeys, a)
	}
}

// adapterID is the number an adapter's events carry as its lora_id: positive, stable for the
// name (vLLM numbers adapters from 1 in the order it loads them; kvgate keys by name instead).
func adapterID(name string) int64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int64(h.Sum32()&0x7fffffff) + 1
}
