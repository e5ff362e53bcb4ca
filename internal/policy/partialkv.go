package policy

import (
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
// a PartialKVView and a prompt without a cache salt, for some.
func (p *Cost) covers(model string, ids []string, salted bool) bool {
	if p.kv.Covers(model, ids) {
		return true
	}
	pv, ok := p.kv.(PartialKVView)
	return ok && !salted && pv.CoversAny(model, ids)
}

// matchEach is PartialKVView.MatchEach when the view is one: ok when it answered for some of
// ids, out[i] −1 for the others.
func (p *Cost) matchEach(model string, toks []uint32, ids []string, out []int) bool {
	pv, ok := p.kv.(PartialKVView)
	return ok && pv.MatchEach(model, toks, ids, out) > 0
}

// treeFill gives each candidate the events could not answer for (out[i] < 0) its Ĉ from the
// prefix tree: what this replica sent it, as its answers corrected it, with F of what follows
// a wholly held routing text. Every candidate's Prompt is set. It leaves out[i] at 0 for those,
// for the placement key.
func (p *Cost) treeFill(av []costCand, req *Request, out []int) {
	tree := map[string]int{} // characters of the routing text the tree places on each worker
	total := 0
	if req.Text != "" {
		_, total = p.tree.RouteDepths(req.Text, func(tenant string, chars int) {
			tree[tenant] = chars
		}, func(*radix.Match) string { return "" })
	}
	for i := range av {
		if out[i] >= 0 {
			continue
		}
		out[i] = 0
		chars := tree[av[i].w.ID]
		c := min(p.sc.est.Tokens(int64(chars)), av[i].t.Prompt)
		if total > 0 && chars >= total {
			c += p.followShare(followOwn) * (av[i].t.Prompt - c) // F of what follows the routing text
		}
		av[i].t.Cached = c
	}
}
