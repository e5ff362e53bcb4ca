package loadmon

import (
	"math"
	"testing"
	"time"
)

var est0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestEstimateRate: μ is the configured start until RateSamples busy intervals measured it, then
// the decaying peak of the backlog's falls; idle intervals, older reports and absurd falls do not
// move it; a rate measured elsewhere replaces the start at once.
func TestEstimateRate(t *testing.T) {
	cfg := EstimateConfig{RateSamples: 2}.WithDefaults()
	var e Estimate
	at := func(s int) time.Time { return est0.Add(time.Duration(s) * time.Second) }
	e.Observe(at(0), 100_000, 4, 0, Busy{}, &cfg)
	e.Observe(at(1), 80_000, 4, 0, Busy{}, &cfg) // fell 20,000 in 1 s
	if got := e.Rate(&cfg); got != 8000 {
		t.Fatalf("rate %g after one sample, want the start 8000 (RateSamples 2)", got)
	}
	e.Observe(at(2), 70_000, 4, 0, Busy{}, &cfg) // fell 10,000: the peak stays 20,000 less its decay
	if got, want := e.Rate(&cfg), 20_000*(1-cfg.RateDecay); math.Abs(got-want) > 1e-9 {
		t.Fatalf("rate %g, want the decayed peak %g", got, want)
	}
	if e.Observe(at(1), 0, 4, 0, Busy{}, &cfg) || !e.Follows(at(2)) {
		t.Fatal("an older report replaced a newer one")
	}
	r0, n0 := e.Measured()
	e.Observe(at(3), 0, 4, 0, Busy{}, &cfg) // drained: nothing queued at the end, no sample
	if r, n := e.Measured(); r != r0 || n != n0 {
		t.Fatalf("an idle interval measured %g (%d), want %g (%d) kept", r, n, r0, n0)
	}
	// A report claiming an absurd fall cannot make the engine look arbitrarily fast.
	e.Observe(at(4), 1e15, 4, 0, Busy{}, &cfg)
	e.Observe(at(5), 1, 4, 0, Busy{}, &cfg)
	if got := e.Rate(&cfg); got > cfg.RateCap*cfg.PrefillRate {
		t.Fatalf("rate %g past RateCap × PrefillRate", got)
	}
	var f Estimate
	f.ObservePromptRate(12_000, &cfg)
	f.ObservePromptRate(math.NaN(), &cfg)
	f.ObservePromptRate(-1, &cfg)
	if got, q := f.PromptRate(&cfg), f.Rate(&cfg); got != 12_000 || q != 12_000 {
		t.Fatalf("prompt rate %g, queue rate %g from a measured 12000 (then NaN and −1, ignored): want both 12000", got, q)
	}
	// A prompt rate below the queue's leaves the queue's: an engine of several slots drains its
	// queue faster than one prompt prefills.
	var g Estimate
	g.ObservePromptRate(1_000, &cfg)
	if got, q := g.PromptRate(&cfg), g.Rate(&cfg); got != 1_000 || q != cfg.PrefillRate {
		t.Fatalf("prompt rate %g, queue rate %g: want 1000 and the default %g", got, q, cfg.PrefillRate)
	}
	g.ObserveQueueRate(5_000, &cfg)
	g.ObserveQueueRate(math.Inf(1), &cfg)
	if q := g.Rate(&cfg); q != 5_000 {
		t.Fatalf("queue rate %g, want the 5000 observed (+Inf ignored)", q)
	}
}

// TestEstimateSends: S is this replica's uncached sends × the replica estimate until a peer says
// what it sent, and the sum of every replica's after; Requests and KVUsage count both origins; a
// new report starts them again.
func TestEstimateSends(t *testing.T) {
	cfg := DefaultEstimateConfig()
	var e Estimate
	e.Observe(est0, 0, 2, 0, Busy{}, &cfg)
	e.Sent(Own, 1000, 400)
	if _, s := e.Prefill(est0, 3, &cfg); s != 1200 {
		t.Fatalf("S %g, want own 400 × 3 replicas", s)
	}
	e.Sent(Peer, 2000, 500)
	if _, s := e.Prefill(est0, 3, &cfg); s != 900 {
		t.Fatalf("S %g with a peer's send, want the sum 400 + 500", s)
	}
	r := Report{PolledAt: est0, Running: 2, InflightAtPoll: 1, Replicas: 3, UsedTokens: 10_000, MaxTokens: 100_000}
	if got := e.Requests(&r, 2); got != 4 {
		t.Fatalf("requests %g, want 2 reported + 1 own + 1 peer", got)
	}
	if got := e.KVUsage(&r); math.Abs(got-0.13) > 1e-12 {
		t.Fatalf("KV usage %g, want (10,000 + 1,000 + 2,000) / 100,000", got)
	}
	e.Finished(Peer, 2000)
	if got := e.Requests(&r, 2); got != 3 {
		t.Fatalf("requests %g after the peer's finish, want 3", got)
	}
	// Prefill drains at μ: after 0.1 s at 8,000 tokens/s, 800 of the 900 sent are done.
	if q, s := e.Prefill(est0.Add(100*time.Millisecond), 3, &cfg); q != 0 || math.Abs(s-100) > 1e-9 {
		t.Fatalf("Q %g S %g after 0.1 s, want 0 and 100", q, s)
	}
	e.Sent(Own, -5, -5) // a negative count is taken as 0
	if e.Observe(est0.Add(time.Second), 0, 2, 1, Busy{}, &cfg); e.Slots() != 2 {
		t.Fatalf("slots %d, want 2 (the running count of a report with requests waiting)", e.Slots())
	}
	if _, s := e.Prefill(est0.Add(time.Second), 3, &cfg); s != 0 {
		t.Fatalf("S %g after a new report, want 0", s)
	}
	if got := e.Requests(&Report{Running: 2, Replicas: 3}, 0); got != 2 {
		t.Fatalf("requests %g after a new report, want its 2", got)
	}
}

// TestEstimateConfig: the defaults, the bounds, and the bytes-to-tokens rule.
func TestEstimateConfig(t *testing.T) {
	if err := (EstimateConfig{}).Validate(); err != nil {
		t.Fatal(err)
	}
	for i, c := range []EstimateConfig{{PrefillRate: -1}, {RateDecay: 2}, {RateSamples: -1}, {RateCap: 0.5}, {BytesPerToken: 100}, {PrefillRate: math.NaN()}} {
		if c.Validate() == nil {
			t.Errorf("config %d accepted", i)
		}
	}
	c := EstimateConfig{BytesPerToken: 3}
	if got := c.Tokens(300); got != 100 {
		t.Fatalf("tokens %g of 300 bytes at 3 a token", got)
	}
	var z EstimateConfig
	if got := z.Tokens(400); got != 100 {
		t.Fatalf("tokens %g of 400 bytes at the default 4", got)
	}
}

// TestEstimateRateFromBusyCounters: where the engine counts its prefill steps' tokens and time
// (SGLang's total_prefill_uncached_tokens, total_prefill_busy_us), an interval's rate is their
// growth's ratio: a backlog that falls by prompts whose prefix was cached while they waited does
// not read as prefill done. An idle interval measures nothing; one that prefilled for half of it
// does without a queue; a counter that went back falls back to the backlog's fall.
func TestEstimateRateFromBusyCounters(t *testing.T) {
	cfg := EstimateConfig{PrefillRate: 20_000, RateDecay: 0.5}.WithDefaults()
	var e Estimate
	at := func(s int) time.Time { return est0.Add(time.Duration(s) * time.Second) }
	busy := func(tok, sec float64) Busy { return Busy{Tokens: tok, Seconds: sec, Counted: true} }
	e.Observe(at(0), 100_000, 4, 4, busy(0, 0), &cfg)
	// The backlog fell 60,000 in 1 s, but the engine computed 8,000 tokens in 1 s of prefill:
	// one counted interval measures μ, where falls wait for RateSamples (4) of them.
	e.Observe(at(1), 40_000, 4, 4, busy(8_000, 1), &cfg)
	if got := e.Rate(&cfg); got != 8_000 {
		t.Fatalf("rate %g, want the counters' 8000 at once, not the backlog's fall of 60000 nor the start 20000", got)
	}
	// Nothing queued, 0.6 s of prefill in the second: 6,000 tokens, 10,000 tokens/s.
	e.Observe(at(2), 0, 4, 0, busy(14_000, 1.6), &cfg)
	if got := e.Rate(&cfg); math.Abs(got-10_000) > 1e-6 {
		t.Fatalf("rate %g, want 10000 from an interval that prefilled 0.6 s of 1", got)
	}
	// 0.1 s of prefill and no queue: too little to say what the engine does under load.
	e.Observe(at(3), 0, 4, 0, busy(14_100, 1.7), &cfg)
	if r, n := e.Measured(); math.Abs(r-10_000) > 1e-6 || n != 5 {
		t.Fatalf("an interval that prefilled 0.1 s measured %g (%d intervals), want 10000 (5) kept", r, n)
	}
	// Counters that went back (a restarted engine) with a queue that fell: the fall counts.
	e.Observe(at(4), 90_000, 4, 4, busy(20_000, 2), &cfg)
	e.Observe(at(5), 60_000, 4, 4, busy(100, 0.01), &cfg)
	if got := e.Rate(&cfg); got != 30_000 {
		t.Fatalf("rate %g, want the 30000 fall after the counters restarted", got)
	}
}
