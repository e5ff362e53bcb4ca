package policy

import (
	"math"
	"sync"
)

// Rotation on decode-bound traffic (docs/routing.md, "Decode-bound traffic: why request counts
// herd"). cache_aware sends a hit to the least loaded holder by in-flight requests. When every
// worker holds the prefix (a hot system prompt) that is least_load, and on decode-bound traffic
// least_load herds: the requests an engine admits together decode one token per step together
// and finish in the same step, its in-flight count drops by the whole cohort at once, and
// least_load sends it the next run of arrivals, whose prefills land in the same few steps. A
// step lasts max(decode cost, prefill time), so a bunched prefill stretches the step that every
// decoding request of the batch waits for. Measured on shared-prefix at 300 req/s, one gateway:
// least_load packs 620 prefill tokens into a prefill step on average against round_robin's 272,
// decoding waits behind prefill 14 % of engine time against 7 %, the mean batch is 247 against
// 124 and TTFT p99 4.3 s against 149 ms. Evenly spaced arrivals keep each step's prefill small
// enough to hide behind its decode.
//
// So while the fleet is decode-bound (decodeBound) cache_aware_hash spaces its picks: a hit
// goes to the least loaded holder that this replica has not picked within the last round (one
// pick per candidate), among those below the placement bound; when every such holder was picked
// within the round, to the least recently picked. Which holder takes a hit does not affect the
// agreement between replicas. Behind one gateway (solo) a new prompt goes to the least recently
// picked worker within the bounds: round robin. Its rendezvous owner buys nothing there (this
// replica's tree, the only one, records wherever it goes, and no worker holds it yet), and
// ordering by rendezvous score broke the round: once every worker had been picked within the
// round, the new prompt went to its owner, a random worker, which then took two picks in one
// round (docs/routing.md §8.7: shared-prefix at 300 req/s, TTFT p99 174 / 168 ms → 152 / 149 ms
// against round_robin's 154 / 152 ms). With several gateways it does not: a new prompt's owner
// must not depend on what one replica picked lately, because its later turns reach other
// replicas, whose trees do not hold it and which place it by its hash (measured on multi-turn
// at 24 conversations/s and 8 gateways, decode-bound: hit rate 0.643 → 0.273 and TTFT p99
// 2.6 s → 19 s when new prompts skipped recent picks there).

// picks remembers, per worker id, the sequence number of this replica's last pick of it. It holds
// one entry per worker ever picked; forget removes one.
type picks struct {
	mu   sync.Mutex
	seq  uint64
	last map[string]uint64
}

// picked records a pick of id.
func (r *picks) picked(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = make(map[string]uint64)
	}
	r.seq++
	r.last[id] = r.seq
}

// lastOf returns the sequence number of the last pick of id; 0 if never picked.
func (r *picks) lastOf(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[id]
}

func (r *picks) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, id)
}

// rotateHolders returns, among the candidates holding the matched prefix, the least recently
// picked one whose load is below the placement bound and within the balance rule; when none is,
// the least loaded holder; nil when no candidate holds the prefix.
// window returns the sequence number of this replica's latest pick and how many picks back a
// pick still counts as recent: one per candidate, a round of round robin.
func (r *picks) window(n int) (seq, gap uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq, uint64(n)
}

// recent reports whether a worker last picked at sequence number last was picked within the
// gap latest picks before seq; never picked (0) is not recent.
func recent(last, seq, gap uint64) bool { return last != 0 && last+gap > seq }

// staler reports whether candidate c, last picked at sequence number last, comes before b, last
// picked at bLast, in round-robin order: picked longer ago (never picked first), the less loaded
// on a tie.
func staler(c *cand, last uint64, b *cand, bLast uint64) bool {
	return last < bLast || last == bLast && lessLoaded(c, b)
}

// rotateHolders returns the candidate a hit goes to among those holding the matched prefix:
// among the holders below the placement bound and within the balance rule, the least loaded one
// this replica has not picked within the last round (one pick per candidate); when every such
// holder was picked within the round, the least recently picked; when no holder is below the
// bound, the least loaded holder. nil when no candidate holds the prefix.
func (p *CacheAwareHash) rotateHolders(av []cand, holders []string, minLoad int64) *cand {
	if !p.decodeBound(av) {
		return leastLoadedHolder(av, holders)
	}
	b := BalanceOf(p.cfg)
	bound := p.bound(av, minLoad)
	seq, gap := p.recent.window(len(av))
	var best, least, oldest *cand
	var oldestLast uint64
	eachHolder(av, holders, func(i int) {
		c := &av[i]
		if least == nil || lessLoaded(c, least) {
			least = c
		}
		if !b.Within(c.load, minLoad) || c.load >= bound {
			return
		}
		l := p.recent.lastOf(c.w.ID)
		if oldest == nil || staler(c, l, oldest, oldestLast) {
			oldest, oldestLast = c, l
		}
		if recent(l, seq, gap) {
			return
		}
		if best == nil || lessLoaded(c, best) {
			best = c
		}
	})
	switch {
	case best != nil:
		return best
	case oldest != nil:
		return oldest
	}
	return least
}

// decodeBound reports whether the rotation applies: the fleet is decode-bound (its engines run
// on average at least rotateBatch requests by their fresh reports) and its engines decode at a
// similar pace (the slowest reported time per token per running request, Running ÷
// GenThroughput, within rotatePace times the fastest). Round robin is the right balancer for
// identical servers only: on a fleet where some engines are slower it gives them an equal share
// (docs/routing.md §9: round_robin's spread 26–131 on a mixed fleet).
func (p *CacheAwareHash) decodeBound(av []cand) bool {
	var running int64
	n := 0
	for i := range av {
		if r, fresh := p.loads.Report(av[i].w); fresh {
			running += r.Running
			n++
		}
	}
	if n == 0 || float64(running) < rotateBatch*float64(n) {
		return false
	}
	return p.uniformPace(av)
}

// uniformPace reports whether the engines decode at a similar pace: the slowest reported time
// per token per running request (Running ÷ GenThroughput) among the fresh reports is within
// rotatePace times the fastest, or no report gives a pace.
func (p *CacheAwareHash) uniformPace(av []cand) bool {
	fast, slow := math.Inf(1), 0.0
	for i := range av {
		r, fresh := p.loads.Report(av[i].w)
		if fresh && r.Running > 0 && r.GenThroughput > 0 {
			itl := float64(r.Running) / r.GenThroughput
			fast, slow = min(fast, itl), max(slow, itl)
		}
	}
	return slow <= rotatePace*fast || slow == 0
}

// rotatePace is how much slower per token than the fastest the slowest engine may decode for the
// fleet to count as uniform. The reported pace also grows with the batch (a step costs 6 ms +
// 0.35 ms per running request in the simulator), so a uniform fleet near saturation, whose
// batches differ by tens of requests, shows ratios well above 1: measured on shared-prefix
// (8 identical engines) a 1.4 gate switched the rotation off now and then (TTFT p99 191–216 ms
// at 300 req/s against 164–174 ms) and 1.6 cost one sweep step of goodput (318.75 against
// 321.88 req/s). With two of eight engines half as fast the ratio stays above 2, which keeps
// that fleet at the previous default's figures (TTFT p99 487 / 592 / 601 ms over three seeds;
// rotating there gave 416 / 759 / 734 ms, and a 2.5 gate 556 / 712 / 589 ms).
const rotatePace = 2

// rotateBatch is the mean running requests per engine from which the fleet counts as
// decode-bound for the rotation. A step lasts max(decode cost, prefill time); with the
// simulator's costs a step of 16 decoding requests (11.6 ms) hides about 90 prefill tokens, so
// below that every prefill stalls the batch whatever the spacing of arrivals, and the load and
// backlog rules decide (measured: the Mooncake twin on a mixed fleet runs about 2 requests per
// engine, and rotation there raised the load spread from 1.95 to 2.52).
const rotateBatch = 16
