package policy

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Prefill-backlog rule of cache_aware_hash's placement (docs/routing.md, "Judging placement by
// the prefill backlog"). Requests counts hide what a new prompt waits for when prompts range
// from a few hundred to twenty thousand tokens: the prefill queued ahead of it. Engines report
// that queue in tokens (SGLang's num_waiting_uncached_tokens on /v1/loads: prompt tokens not yet
// prefilled that missed the cache); a replica adds the uncached tokens it sent each worker since
// its last poll. While the fleet is prefill-bound — the largest backlog exceeds the least by more
// than prefillGateTokens — a new prompt is placed only on a worker within spillTokens of the
// least backlog, the rendezvous order choosing among those.
//
// The rule applies only while a replica judges itself alone (the report's replica estimate
// below soloReplicas): its sends since the poll are then all the sends, so reported plus sent is
// the engine's backlog. With several replicas each sees only its own sends, their views differ
// and the veto breaks their agreement on owners (measured on the Mooncake twin at 8 gateways:
// hit rate 0.228 → 0.140), so there the request-count bound alone decides.
const (
	// prefillGateTokens is the backlog difference (about one second of prefill at the
	// simulator's default 8,000 tokens/s) beyond which the fleet counts as prefill-bound. Below
	// it, on decode-bound traffic, the veto only adds noise (shared-prefix at 300 req/s:
	// TTFT p99 308 ms without a gate, 846 ms with none, 289 ms with it).
	prefillGateTokens = 8192
	// spillTokens is how far above the least backlog a worker may be and still take a new prompt.
	spillTokens = 512
	// soloReplicas: a replica estimate below it means one gateway (see above).
	soloReplicas = 1.5
	// charsPerToken converts routing-text characters into tokens for the since-poll estimate.
	charsPerToken = 4
)

// sentTokens counts, per worker id, the uncached prompt tokens this replica sent since the
// worker's last poll. It holds one entry per worker ever picked; Forget removes one.
type sentTokens struct {
	mu sync.Mutex
	m  map[string]sentEntry
}

type sentEntry struct {
	polled  time.Time // the PolledAt of the report the count follows
	backlog float64   // the backlog that report gave, in tokens
	tokens  float64
	rate    float64 // measured prefill rate, tokens per second (cacheawarespeed.go)
	samples int     // busy intervals the rate was measured over
	peak    float64 // decaying peak of the report-only drain, tokens per second
	peaks   int     // intervals the peak was measured over
}

// add counts tokens sent to id after the poll at polled, whose report gave a backlog of
// reported tokens; a newer poll restarts the count (and measures the rate, sentEntry.roll).
func (s *sentTokens) add(id string, polled time.Time, reported, tokens float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]sentEntry)
	}
	e := s.m[id].roll(polled, reported)
	if e.polled.Equal(polled) {
		e.tokens += tokens
	}
	s.m[id] = e
}

// since returns the tokens sent to id after the poll at polled.
func (s *sentTokens) since(id string, polled time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[id]; ok && e.polled.Equal(polled) {
		return e.tokens
	}
	return 0
}

func (s *sentTokens) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// Pick is CacheAware's pick; it then counts the uncached tokens it expects to send the chosen
// worker (the routing text less the share predicted cached) for the prefill-backlog rule.
func (p *CacheAwareHash) Pick(candidates []*worker.Worker, req *Request) *worker.Worker {
	w := p.CacheAware.Pick(candidates, req)
	if w == nil || req == nil {
		return w
	}
	p.recent.picked(w.ID)
	if r, ok := p.loads.Report(w); ok && r.HasUncachedTokens {
		p.sent.add(w.ID, r.PolledAt, float64(r.WaitingUncachedTokens), uncachedTokens(req))
	}
	return w
}

// Forget drops the worker from the tree and from the since-poll counts.
func (p *CacheAwareHash) Forget(workerID string) {
	p.CacheAware.Forget(workerID)
	p.sent.forget(workerID)
	p.recent.forget(workerID)
}

// backlogs fills tok with every candidate's prefill backlog in tokens (reported plus sent since
// the poll) and returns the least, ok false when the rule does not apply: some candidate has no
// fresh report of its queued tokens, a replica estimate says several gateways share the fleet,
// or the fleet is not prefill-bound.
//
// Each backlog is divided by its worker's speed weight (weight, nil for all 1): the expected
// wait in tokens of a median engine (cacheawarespeed.go).
func (p *CacheAwareHash) backlogs(av []cand, tok, weight []float64) (least float64, ok bool) {
	var most float64
	for i := range av {
		r, fresh := p.loads.Report(av[i].w)
		if !fresh || !r.HasUncachedTokens || r.Replicas >= soloReplicas {
			return 0, false
		}
		p.sent.observe(av[i].w.ID, r.PolledAt, float64(r.WaitingUncachedTokens))
		t := float64(r.WaitingUncachedTokens) + p.sent.since(av[i].w.ID, r.PolledAt)
		if weight != nil {
			t /= weight[i]
		}
		tok[i] = t
		if i == 0 || t < least {
			least = t
		}
		most = max(most, t)
	}
	return least, most-least > prefillGateTokens
}

// solo reports whether this replica judges itself the fleet's only gateway: some candidate has
// a fresh report and every fresh report's replica estimate is below soloReplicas. Without any
// report the replica cannot tell, and is taken as one of several (the rules that need agreement
// between replicas stay on).
func (p *CacheAwareHash) solo(av []cand) bool {
	seen := false
	for i := range av {
		r, fresh := p.loads.Report(av[i].w)
		if !fresh {
			continue
		}
		if r.Replicas >= soloReplicas {
			return false
		}
		seen = true
	}
	return seen
}

// uncachedTokens estimates the prompt tokens req sends its worker that miss the cache: the whole
// prompt (PromptBytes, else the routing text) less the part of the routing text predicted cached.
func uncachedTokens(req *Request) float64 {
	n := float64(max(req.PromptBytes, len(req.Text)))
	return max(n-float64(len(req.Text))*req.Decision.Predicted, 0) / charsPerToken
}
