package engine

import (
	"math"
	"time"
)

// Load is an engine's load report, the fields of the native /v1/loads schema plus cumulative
// counters for Prometheus. The zero value is an idle, empty engine.
type Load struct {
	// Running and Waiting are the requests admitted and queued.
	Running, Waiting int
	// WaitingUncachedTokens is the prompt tokens of queued requests that missed the prefix
	// cache when they were queued.
	WaitingUncachedTokens int64
	// PrefillTokens is the prompt tokens queued or admitted but not yet prefilled (the queued
	// ones counted without their cached prefix): the prefill work ahead of a new request.
	PrefillTokens int64
	// UsedTokens is the KV capacity held by running requests (whole blocks); evictable cached
	// blocks count as free. MaxTokens is the capacity.
	UsedTokens, MaxTokens int64
	// TokenUsage is UsedTokens/MaxTokens.
	TokenUsage float64
	// GenThroughput is generated tokens per second, an exponential moving average over
	// Config.StatsWindow.
	GenThroughput float64
	// CacheHitRate is the share of admitted prompt tokens that hit the prefix cache, weighted by
	// tokens, an exponential moving average over Config.StatsWindow; 0 before any admission.
	CacheHitRate float64
	// MaxRunning is Config.MaxRunning.
	MaxRunning int
	// PromptTokens and CachedTokens count the prompt tokens of admitted requests and those that
	// hit the cache, since start (vLLM's prefix cache queries and hits).
	PromptTokens, CachedTokens int64
	// GeneratedTokens counts output tokens since start.
	GeneratedTokens int64
	// PrefillSeconds is the time requests spent in prefill since start, summed over requests:
	// each from the step that first scheduled its prefill to its first token (vLLM's
	// request_prefill_time_seconds, whose sum it is). PrefilledTokens is the uncached prompt
	// tokens of the same requests, counted with them: their ratio is a prompt's prefill rate.
	PrefillSeconds  float64
	PrefilledTokens int64
	// PrefilledRequests counts the requests PrefillSeconds sums over (the histogram's _count).
	PrefilledRequests int64
	// PrefillBusySeconds is the time since start of the steps that carried prefill, and
	// PrefillBusyTokens the prompt tokens those steps computed (SGLang's /v1/loads
	// total_prefill_busy_us and total_prefill_uncached_tokens): their ratio is the rate the
	// engine gets prefill done while it has prefill to do.
	PrefillBusySeconds float64
	PrefillBusyTokens  int64
	// Finished, Aborted and Preemptions count those events since start.
	Finished, Aborted, Preemptions int64
	// DecodeStall is the time since start by which steps with decoding requests ran longer than
	// their decode cost because the prefill chunk they carried took longer (a step lasts
	// max(decode cost, prefill time)): the time every decoding request waited for prefill. A
	// simulator statistic: no engine reports it.
	DecodeStall time.Duration
}

// Load returns the load at the engine's latest time (see Now).
func (e *Engine) Load() Load {
	bs := int64(e.cfg.BlockSize)
	l := Load{
		Running:               len(e.running),
		Waiting:               len(e.waiting) - e.wh,
		WaitingUncachedTokens: e.uncached,
		PrefillTokens:         e.uncached,
		UsedTokens:            int64(e.cache.used()) * bs,
		MaxTokens:             int64(e.cache.total) * bs,
		MaxRunning:            e.cfg.MaxRunning,
		PromptTokens:          e.stats.prompt,
		CachedTokens:          e.stats.cached,
		GeneratedTokens:       e.stats.generated,
		PrefillSeconds:        e.stats.prefill.Seconds(),
		PrefilledTokens:       e.stats.prefilledTokens,
		PrefilledRequests:     e.stats.prefilledRequests,
		PrefillBusySeconds:    e.stats.prefillBusy.Seconds(),
		PrefillBusyTokens:     e.stats.prefillBusyTokens,
		Finished:              e.stats.finished,
		Aborted:               e.stats.aborted,
		Preemptions:           e.stats.preempted,
		DecodeStall:           e.stats.stall,
	}
	for _, r := range e.running {
		if e.cfg.Timing == TimingPerSlot {
			l.PrefillTokens += e.slotPrefillLeft(r)
			continue
		}
		l.PrefillTokens += int64(max(r.target-r.computed, 0))
	}
	l.TokenUsage = float64(l.UsedTokens) / float64(l.MaxTokens)
	w := e.cfg.StatsWindow
	if w > 0 {
		l.GenThroughput = e.stats.gen.at(e.now, w) / w.Seconds()
	}
	if hits, q := e.stats.hits.at(e.now, w); q > 0 {
		l.CacheHitRate = hits / q
	}
	return l
}

// stats are the engine's counters and moving averages.
type stats struct {
	prompt, cached, generated    int64
	finished, aborted, preempted int64
	stall                        time.Duration // see Load.DecodeStall
	prefill                      time.Duration // see Load.PrefillSeconds
	prefilledTokens              int64         // see Load.PrefilledTokens
	prefilledRequests            int64         // see Load.PrefilledRequests
	prefillBusy                  time.Duration // see Load.PrefillBusySeconds
	prefillBusyTokens            int64         // see Load.PrefillBusyTokens
	gen                          decayed
	// hits decays the cached tokens and the prompt tokens (the queries) together: they are
	// always added at the same time, so one exponential serves both.
	hits decayedPair
}

func (s *stats) admit(t, w time.Duration, cached, prompt int) {
	s.prompt += int64(prompt)
	s.cached += int64(cached)
	s.hits.add(t, w, float64(cached), float64(prompt))
}

// prefilled counts one request's time in prefill, from its first scheduled step to its first
// token, and the uncached tokens it prefilled.
func (s *stats) prefilled(d time.Duration, uncached int) {
	s.prefill += max(d, 0)
	s.prefilledTokens += int64(max(uncached, 0))
	s.prefilledRequests++
}

func (s *stats) generate(t, w time.Duration, n int) {
	s.generated += int64(n)
	s.gen.add(t, w, float64(n))
}

// decayed is a sum whose terms decay exponentially with time constant w: a steady rate r gives
// a value of r·w.
type decayed struct {
	v float64
	t time.Duration
}

func (d *decayed) at(t, w time.Duration) float64 {
	if t <= d.t || w <= 0 {
		return d.v
	}
	return d.v * math.Exp(-float64(t-d.t)/float64(w))
}

func (d *decayed) add(t, w time.Duration, x float64) {
	d.v = d.at(t, w) + x
	d.t = max(t, d.t)
}

// decayedPair is two decayed sums that always advance together.
type decayedPair struct {
	a, b float64
	t    time.Duration
}

func (d *decayedPair) at(t, w time.Duration) (a, b float64) {
	if t <= d.t || w <= 0 {
		return d.a, d.b
	}
	f := math.Exp(-float64(t-d.t) / float64(w))
	return d.a * f, d.b * f
}

func (d *decayedPair) add(t, w time.Duration, x, y float64) {
	a, b := d.at(t, w)
	d.a, d.b = a+x, b+y
	d.t = max(t, d.t)
}
