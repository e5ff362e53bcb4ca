package kvevents

import "time"

// LoRA adapters' blocks. vLLM mixes a request's adapter into the hash of every block it stores
// (the adapter's name is among the first block's extra keys, and every later hash chains over
// it), and its BlockStored events carry the adapter's id ("lora_id", a number the engine
// assigns) and, in newer vLLM, its name ("lora_name"). The index keys blocks by token ids
// chained from a seed: the equivalent is a seed per adapter. A stored chain that names its
// adapter is seeded by the name (AdapterSeed), which a request names too, so a lookup for the
// adapter (MatchAdapter) meets exactly that adapter's blocks, on any engine; a chain that gives
// only the id is seeded by the id, kept apart from the base model's and every named adapter's
// but reachable by no lookup (ids are per engine); and since such a stream could hold the
// adapter's blocks unseen, a lookup for any adapter in it cannot answer (MatchAdapter reports
// false, and the caller falls back to the adapter's prefix tree) rather than answer none.

// adapterDomain separates an adapter's seed from a cache salt's digest of the same bytes.
const adapterDomain = 0x4c6f5241 // "LoRA"

// AdapterSeed is the chain seed of the blocks of the adapter named name ("" the base model's).
func AdapterSeed(name string) uint64 {
	if name == "" {
		return keySeed
	}
	return mix(mix(keySeed, adapterDomain), SaltDigest([]byte(name)))
}

// storedSeed is the seed of a stored chain that starts a prompt: its adapter's, by name when
// the event gives one, else by id.
func storedSeed(e *Event) uint64 {
	if e.LoRAName != "" {
		return AdapterSeed(e.LoRAName)
	}
	return seedFor(e.LoRA, e.HasLoRA)
}

// MatchAdapter is Match for a prompt of the adapter named adapter ("" the base model) with
// an optional cache salt (salted, of digest salt): it meets only the blocks stored for that
// adapter under that salt. model is the name the engines' topics give (the adapter's base
// model), which selects the streams as Match's does.
func (x *Index) MatchAdapter(model, adapter string, salt uint64, salted bool, toks []uint32, workers []string, out []int, now time.Time) bool {
	if adapter != "" && x.idOnly(model, workers) {
		return false
	}
	seed := AdapterSeed(adapter)
	if salted {
		seed = saltSeed(seed, salt)
	}
	return x.match(model, seed, toks, workers, out, now, false) == len(workers)
}

// MatchAdapter is Index.MatchAdapter at the current time (policy.AdapterMatcher).
func (v *View) MatchAdapter(model, adapter string, salt uint64, salted bool, toks []uint32, workers []string, out []int) bool {
	return v.Service.idx.MatchAdapter(model, adapter, salt, salted, toks, workers, out, v.now())
}

// noteAdapter records that h stored an adapter's blocks by id alone.
func (h *holder) noteAdapter(e *Event) {
	if e.HasLoRA && e.LoRAName == "" {
		h.loraIDOnly = true
	}
}

// idOnly reports whether a stream of model of one of workers stored an adapter's blocks by id
// alone.
func (x *Index) idOnly(model string, workers []string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, w := range workers {
		wb := x.workers[w]
		if wb == nil {
			continue
		}
		for _, h := range wb.holders {
			if (h.src.Model == "" || h.src.Model == model) && h.loraIDOnly {
				return true
			}
		}
	}
	return false
}
