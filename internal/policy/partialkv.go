package policy

import (
	"time"

	"github.com/kvgate/kvgate/internal/radix"
)

// PartialKVView is implemented by KV views that can answer for some workers and not others
// (package kvevents: an engine that has not published yet, or is being resynchronized). With
// it, precise_prefix scores each worker the events cannot answer for from the prefix tree,
// and the others from their events, instead of falling back to the tree for every worker.
type PartialKVView interface {
	// CoversAny reports whether MatchEach can answer for at least one of workers.
	CoversAny(model string, workers []string) bool
	// MatchEach writes to out[i] the leading tokens of toks that workers[i]'s engine holds,
	// −1 where the events cannot answer for it; it returns how many it answered for.
	MatchEach(model string, toks []uint32, workers []string, out []int) int
}

// covers reports whether the events can answer for the workers ids: for all of them, or, with
// a PartialKVView, for some.
func (p *Cost) covers(model string, ids []string) bool {
	if p.kv.Covers(model, ids) {
		return true
	}
	pv, ok := p.kv.(PartialKVView)
	return ok && pv.CoversAny(model, ids)
}

// eventsCachedEach is eventsCached for a fleet the events answer for only in part: each worker
// they cannot answer for gets Ĉ from the prefix tree (what this replica sent it, and what its
// answers corrected), the others from their events. ok false when the view is not a
// PartialKVView or answers for none.
func (p *Cost) eventsCachedEach(av []costCand, req *Request, toks []uint32) (uint64, bool) {
	pv, ok := p.kv.(PartialKVView)
	if !ok {
		return 0, false
	}
	start := time.Now()
	var idBuf [64]string
	var outBuf [64]int
	ids, out := idBuf[:0], outBuf[:0]
	for i := range av {
		ids = append(ids, av[i].w.ID)
		out = append(out, 0)
	}
	if pv.MatchEach(req.Model, toks, ids, out) == 0 {
		return 0, false
	}
	tree := map[string]int{} // characters of the routing text the tree places on each unanswered worker
	total := 0
	if req.Text != "" {
		_, total = p.tree.RouteDepths(req.Text, func(tenant string, chars int) {
			tree[tenant] = chars
		}, func(*radix.Match) string { return "" })
	}
	prompt := float64(len(toks))
	rest := 0.0
	if !req.Chat {
		rest = max(float64(req.PromptBytes-len(req.Text)), 0) / p.sc.cfg.BytesPerToken
	}
	for i := range av {
		av[i].t.Prompt = prompt + rest
		if out[i] >= 0 {
			av[i].t.Cached = float64(out[i])
			if out[i] >= len(toks) {
				av[i].t.Cached += p.sc.cfg.FollowShare * rest
			}
			continue
		}
		chars := tree[av[i].w.ID]
		c := min(float64(chars)/p.sc.cfg.BytesPerToken, av[i].t.Prompt)
		if total > 0 && chars >= total {
			c += p.followShare(followOwn) * (av[i].t.Prompt - c) // F of what follows the routing text
		}
		av[i].t.Cached = c
	}
	for i := range out {
		out[i] = max(out[i], 0)
	}
	p.decideNS.Add(int64(time.Since(start)))
	p.decided.Add(1)
	return tokenPlacementKey(toks, out), true
}
