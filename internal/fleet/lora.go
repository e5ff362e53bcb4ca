package fleet

import (
	"io"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
)

// LoRA adapters in the simulated fleet. A turn that names a model (bench.WithAdapters) runs on
// that adapter: every engine serves every adapter (vLLM with each adapter in --lora-modules),
// with Config.Engine.MaxLoras slots; each gateway keeps one policy per adapter, as the gateway's
// router keeps one per model (an adapter is a pool of its own), each with its own prefix tree;
// and the reports carry the engines' adapter state as vLLM's lora_requests_info says it, which
// the cost's adapter term reads.

// policyFor returns the gateway's policy for a turn of adapter ("" the base model): the base
// policy, or the adapter's own, built on first use from the same configuration. The oracle
// serves every adapter itself.
func (g *gateway) policyFor(adapter string) policy.Policy {
	if adapter == "" || g.pc == nil {
		return g.pol
	}
	if p, ok := g.pols[adapter]; ok {
		return p
	}
	p, err := policy.New(g.s.cfg.Policy, *g.pc)
	if err != nil {
		return g.pol // the same config built the base policy
	}
	if g.pols == nil {
		g.pols = map[string]policy.Policy{}
	}
	g.pols[adapter] = p
	return p
}

// adapterPolicies calls fn with every adapter's policy (not the base one).
func (g *gateway) adapterPolicies(fn func(policy.Policy)) {
	for _, p := range g.pols {
		fn(p)
	}
}

// evictAdapters trims the adapter policies' trees, closeAdapters stops what they run.
func (g *gateway) evictAdapters() {
	g.adapterPolicies(func(p policy.Policy) {
		if e, ok := p.(policy.Evicter); ok {
			e.Evict()
		}
	})
}

func (g *gateway) closeAdapters() {
	g.adapterPolicies(func(p policy.Policy) {
		if c, ok := p.(io.Closer); ok {
			c.Close()
		}
	})
}

// forgetAdapters drops a removed worker from every adapter policy.
func (g *gateway) forgetAdapters(id string) {
	g.adapterPolicies(func(p policy.Policy) {
		if f, ok := p.(policy.Forgetter); ok {
			f.Forget(id)
		}
	})
}

// loraReport is engine i's adapter state as vLLM reports it; nil when the engines have no
// adapter slots.
func (s *sim) loraReport(i int) *loadmon.LoRA {
	if s.cfg.Engine.MaxLoras == 0 {
		return nil
	}
	st := s.engines[i].e.Lora()
	return &loadmon.LoRA{Running: st.Running, Waiting: st.Waiting, MaxLoras: int64(st.MaxLoras),
		At: s.now.Seconds(), Has: true}
}
