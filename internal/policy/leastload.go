package policy

import (
	"math"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// Expected-wait model of least_load (issue 5):
//
//	wait = (queued uncached tokens + in-flight token estimate) / generation throughput
//	       + kvWaitScale × k/(1−k)                     for KV-cache usage k
//
// The in-flight token estimate is the requests this gateway sent to the worker since the poll
// (local in-flight now minus at the poll, never negative: finished requests are not subtracted,
// since they were most likely running rather than queued) times the worker's own average queued
// uncached prompt size (its uncached tokens / its waiting requests), or defaultRequestTokens
// when its queue is empty. A worker that reports waiting requests but not their tokens (SGLang
// Prometheus) is charged the same per-request estimate for them.
const (
	// kvWaitScale is the seconds of wait that KV usage k adds as k/(1−k): 0.15 s at k=0.5,
	// 1.35 s at 0.9, growing without bound as the cache fills (the worker must evict or preempt).
	kvWaitScale = 0.15
	// maxTokenUsage clamps k below 1 so the KV term stays finite (15 s at the clamp).
	maxTokenUsage = 0.99
	// defaultRequestTokens is the uncached prompt tokens assumed per request when the worker's
	// queue gives no average: a short chat turn's tail after a cached system prompt.
	defaultRequestTokens = 512
	// defaultGenThroughput (tokens/s) stands in for an idle worker's throughput (an idle worker
	// reports 0) when no candidate reports a positive one; otherwise their mean does.
	defaultGenThroughput = 1000
)

// LeastLoad picks the available worker with the least expected wait. When some available
// candidate has no fresh token-level report (a failed or stale poll, a vLLM worker before its
// second poll gives a throughput, a server that reports only request counts),
// seconds and request counts do not compare, so the whole pick falls back to the least
// effective load. Ties go to the lower effective load, then fewer processed requests, then the
// earlier candidate. Zero value unusable: use NewLeastLoad.
type LeastLoad struct {
	loads Loads
}

var _ Policy = (*LeastLoad)(nil)

// NewLeastLoad returns a LeastLoad policy reading cfg.Loads (nil: local in-flight counts only,
// which makes it a pure least-in-flight policy).
func NewLeastLoad(cfg Config) *LeastLoad { return &LeastLoad{loads: cfg.withDefaults().Loads} }

// Name returns "least_load".
func (*LeastLoad) Name() string { return "least_load" }

// llCand is one available candidate's view during a pick.
type llCand struct {
	w     *worker.Worker
	load  int64
	r     loadmon.Report
	tok   bool // fresh report with token data
	wait  float64
	index int
}

// Pick returns the available worker with the least expected wait (or least effective load).
func (p *LeastLoad) Pick(candidates []*worker.Worker, _ *Request) *worker.Worker {
	var abuf [16]cand
	av, _ := gatherLoads(abuf[:0], candidates, p.loads)
	var buf [16]llCand
	cs := buf[:0]
	allTok := true
	var tputSum float64
	var nTput int
	for _, a := range av {
		c := llCand{w: a.w, load: a.load, index: a.idx}
		c.r, c.tok = p.loads.Report(a.w)
		c.tok = c.tok && c.r.HasTokenData
		allTok = allTok && c.tok
		if c.tok && c.r.GenThroughput > 0 {
			tputSum += c.r.GenThroughput
			nTput++
		}
		cs = append(cs, c)
	}
	if len(cs) == 0 {
		return nil
	}
	if allTok {
		fallback := float64(defaultGenThroughput)
		if nTput > 0 {
			fallback = tputSum / float64(nTput)
		}
		for i := range cs {
			cs[i].wait = ExpectedWait(cs[i].r, cs[i].w.Inflight(), fallback)
		}
	}
	best := &cs[0]
	for i := 1; i < len(cs); i++ {
		if c := &cs[i]; llLess(c, best) {
			best = c
		}
	}
	return best.w
}

// llLess orders candidates: wait (zero for all on the fallback path), effective load, processed
// requests, candidate index.
func llLess(a, b *llCand) bool {
	if a.wait != b.wait {
		return a.wait < b.wait
	}
	if a.load != b.load {
		return a.load < b.load
	}
	if pa, pb := a.w.Processed(), b.w.Processed(); pa != pb {
		return pa < pb
	}
	return a.index < b.index
}

// ExpectedWait returns least_load's expected wait in seconds for a worker whose fresh report is
// r and to which this gateway has local requests in flight; fallbackTput (tokens/s) replaces a
// throughput of zero (an idle worker). It is pure, so the fleet simulator can use it.
func ExpectedWait(r loadmon.Report, local int64, fallbackTput float64) float64 {
	perReq := float64(defaultRequestTokens)
	if r.HasUncachedTokens && r.Waiting > 0 && r.WaitingUncachedTokens > 0 {
		perReq = float64(r.WaitingUncachedTokens) / float64(r.Waiting)
	}
	queued := float64(r.WaitingUncachedTokens)
	if !r.HasUncachedTokens {
		queued = float64(r.Waiting) * perReq
	}
	tokens := queued + float64(max(local-r.InflightAtPoll, 0))*perReq
	tput := r.GenThroughput
	if !(tput > 0) {
		tput = fallbackTput
	}
	var wait float64
	if tokens > 0 {
		wait = tokens / max(tput, 0) // +Inf without any throughput to go by
	}
	k := min(max(r.TokenUsage, 0), maxTokenUsage)
	wait += kvWaitScale * k / (1 - k)
	if math.IsNaN(wait) {
		return math.Inf(1)
	}
	return wait
}
