package fleet

import (
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
)

// An adapter's blocks in the simulated events: each engine's BlockStored of an adapter's prompt
// names the adapter (engine.AdapterObserver), as vLLM's lora_name does, so a replica's index
// keys them by it and precise_prefix looks an adapter's request up by its adapter
// (policy.AdapterMatcher).

// StoredAdapter notes the adapter of the block stored next.
func (o engineEvents) StoredAdapter(adapter string) { o.f.adapter = adapter }

var _ engine.AdapterObserver = engineEvents{}

// MatchAdapter is the replica index's MatchAdapter, after delivering what is due.
func (r *replicaKV) MatchAdapter(model, adapter string, salt uint64, salted bool, toks []uint32, ids []string, out []int) bool {
	r.deliver()
	return r.idx.MatchAdapter(model, adapter, salt, salted, toks, ids, out, epoch.Add(r.g.s.now))
}

var _ policy.AdapterMatcher = (*replicaKV)(nil)
