package flow

import (
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// report is an engine's report at t0+at: used of 100,000 KV tokens, queued prefill tokens.
func report(at time.Duration, used, queued int64) loadmon.Report {
	return loadmon.Report{PolledAt: t0.Add(at), Running: 4, UsedTokens: used, MaxTokens: 100_000,
		TokenUsage: float64(used) / 100_000, WaitingUncachedTokens: queued, HasUncachedTokens: true}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestJudgeKVBetweenReports: KV usage follows this replica's sends and finishes from the moment
// they happen, and a new report replaces what the estimate added.
func TestJudgeKVBetweenReports(t *testing.T) {
	var e loadmon.Estimate
	r := report(0, 85_000, 0)
	s := Saturation{MaxKVUsage: 0.8}.WithDefaults()
	judge := func(r *loadmon.Report, at time.Duration) Signals {
		sig := Signals{Available: true}
		s.Judge(&sig, &e, r, t0.Add(at))
		return sig
	}
	if sig := judge(&r, 0); !near(sig.KVUsage, 0.85) || s.Headroom(sig) != 0 {
		t.Fatalf("usage %g headroom %g: the report's 0.85 is over the bound", sig.KVUsage, s.Headroom(sig))
	}
	// A request sent before the report (holding 20,000 tokens) finishes: the engine has room at
	// once, not at the next poll.
	e.Finished(loadmon.Own, 20_000)
	sig := judge(&r, 100*time.Millisecond)
	if !near(sig.KVUsage, 0.65) || s.Headroom(sig) < 1 {
		t.Fatalf("usage %g headroom %g after a finish, want 0.65 and room", sig.KVUsage, s.Headroom(sig))
	}
	// This replica sends 10,000 tokens: counted before the engine admits them.
	e.Sent(loadmon.Own, 10_000, 2_000)
	if sig := judge(&r, 200*time.Millisecond); !near(sig.KVUsage, 0.75) {
		t.Fatalf("usage %g after a send, want 0.75", sig.KVUsage)
	}
	// The next report counts what happened; the corrections start again from it.
	r2 := report(time.Second, 70_000, 0)
	if sig := judge(&r2, time.Second); !near(sig.KVUsage, 0.70) {
		t.Fatalf("usage %g at a new report, want its 0.70", sig.KVUsage)
	}
	// More finished than the report held: never below 0. More sent than fits: never above 1.
	e.Finished(loadmon.Own, 500_000)
	if sig := judge(&r2, time.Second); sig.KVUsage != 0 {
		t.Fatalf("usage %g, want 0", sig.KVUsage)
	}
	e.Sent(loadmon.Own, 2_000_000, 0)
	if sig := judge(&r2, time.Second); sig.KVUsage != 1 {
		t.Fatalf("usage %g, want 1", sig.KVUsage)
	}
}

// TestJudgeKVWithoutCapacity: a report without the cache's capacity (vLLM's Prometheus gives
// only a share) is taken as it stands.
func TestJudgeKVWithoutCapacity(t *testing.T) {
	var e loadmon.Estimate
	s := DefaultSaturation()
	r := loadmon.Report{PolledAt: t0, TokenUsage: 0.9}
	e.Sent(loadmon.Own, 50_000, 0)
	sig := Signals{Available: true}
	s.Judge(&sig, &e, &r, t0)
	if sig.KVUsage != 0.9 || sig.HasWait {
		t.Fatalf("usage %g wait %v, want the report's 0.9 and no predicted wait", sig.KVUsage, sig.HasWait)
	}
	// A share with the capacity but no used-token count: the share's tokens are the base.
	r = loadmon.Report{PolledAt: t0.Add(time.Second), TokenUsage: 0.5, MaxTokens: 100_000}
	e.Finished(loadmon.Own, 10_000)
	s.Judge(&sig, &e, &r, t0.Add(time.Second))
	if !near(sig.KVUsage, 0.5) {
		t.Fatalf("usage %g at a new report, want 0.5", sig.KVUsage)
	}
	e.Finished(loadmon.Own, 10_000)
	s.Judge(&sig, &e, &r, t0.Add(time.Second))
	if !near(sig.KVUsage, 0.4) {
		t.Fatalf("usage %g after a finish, want 0.4", sig.KVUsage)
	}
}

// TestJudgePredictedWait: the queued prefill drains at the engine's rate between reports and
// grows by what this replica sent uncached; Drain says when the bound is reached.
func TestJudgePredictedWait(t *testing.T) {
	var e loadmon.Estimate
	r := report(0, 0, 16_000) // 2 s at the nominal 8,000 tokens/s
	s := Saturation{MaxPredictedWait: time.Second}.WithDefaults()
	judge := func(at time.Duration) Signals {
		sig := Signals{Available: true}
		s.Judge(&sig, &e, &r, t0.Add(at))
		return sig
	}
	sig := judge(0)
	if !sig.HasWait || !near(sig.PredictedWait, 2) || s.Headroom(sig) != 0 {
		t.Fatalf("wait %g headroom %g, want 2 s and none", sig.PredictedWait, s.Headroom(sig))
	}
	if d, ok := s.Drain(sig); !ok || d != time.Second+time.Millisecond {
		t.Fatalf("drain %v %v, want 1.001s", d, ok)
	}
	sig = judge(1500 * time.Millisecond)
	if !near(sig.PredictedWait, 0.5) || s.Headroom(sig) < 1 {
		t.Fatalf("wait %g headroom %g after 1.5 s, want 0.5 s and room", sig.PredictedWait, s.Headroom(sig))
	}
	if _, ok := s.Drain(sig); ok {
		t.Fatal("drain asked for below the bound")
	}
	e.Sent(loadmon.Own, 20_000, 8_000) // mostly a cache hit: only the uncached part queues prefill
	if sig = judge(1500 * time.Millisecond); !near(sig.PredictedWait, 1.5) {
		t.Fatalf("wait %g after an uncached send of 1 s, want 1.5 s", sig.PredictedWait)
	}
	if sig = judge(10 * time.Second); sig.PredictedWait != 0 {
		t.Fatalf("wait %g long after, want 0", sig.PredictedWait)
	}
	// A saturated engine is not woken for its prefill when something else holds it back.
	full := Signals{Available: true, HasReport: true, KVUsage: 0.95, HasWait: true, PredictedWait: 5}
	if _, ok := s.Drain(full); ok {
		t.Fatal("drain asked for an engine whose KV cache is full")
	}
}

// TestCanStart: an engine can start a request while it is available and under its KV and slot
// bounds, whatever its queued prefill (which the routing cost weighs); headroom needs the
// prefill bound too.
func TestCanStart(t *testing.T) {
	s := Saturation{MaxWaiting: -1, MaxKVUsage: 0.8, MaxPredictedWait: time.Second, DefaultSlots: 4}.WithDefaults()
	cases := []struct {
		name          string
		sig           Signals
		start, headed bool
	}{
		{"idle", Signals{Available: true}, true, true},
		{"long prefill queue", Signals{Available: true, HasWait: true, PredictedWait: 3}, true, false},
		{"kv at the bound", Signals{Available: true, HasReport: true, KVUsage: 0.8}, false, false},
		{"slots full", Signals{Available: true, HasReport: true, Running: 4, Slots: 4}, false, false},
		{"unavailable", Signals{HasWait: true}, false, false},
	}
	for _, c := range cases {
		if got := s.CanStart(c.sig); got != c.start {
			t.Errorf("%s: can start %v, want %v", c.name, got, c.start)
		}
		if got := s.Headroom(c.sig) >= 1; got != c.headed {
			t.Errorf("%s: headroom %v, want %v", c.name, got, c.headed)
		}
	}
}

// TestJudgeStatedBatch: an engine that states its running batch (max_running_requests) is full
// at it under the default MaxWaiting, from its first report and before any shows requests
// waiting, and this replica's sends and finishes since the report move it; an engine that states
// none may hold LearnWaiting waiting (so that a report shows its batch full), and an explicit
// MaxWaiting holds for both.
func TestJudgeStatedBatch(t *testing.T) {
	inflight := int64(3)
	judge := func(s Saturation, e *loadmon.Estimate, r loadmon.Report) Signals {
		sig := Signals{Available: true, Inflight: inflight}
		s.Judge(&sig, e, &r, r.PolledAt)
		return sig
	}
	def := DefaultSaturation()
	// The 3 running are this replica's.
	stated := loadmon.Report{PolledAt: t0, Running: 3, MaxRunning: 4, InflightAtPoll: 3}
	var e loadmon.Estimate
	sig := judge(def, &e, stated)
	if sig.Slots != 4 || !sig.SlotsStated || def.Headroom(sig) != 1 {
		t.Fatalf("slots %d stated %v headroom %g, want 4, true and the one free slot", sig.Slots, sig.SlotsStated, def.Headroom(sig))
	}
	inflight = 4 // this replica sent one since the report
	if sig := judge(def, &e, stated); def.CanStart(sig) {
		t.Fatal("an engine whose 4 slots are running took a request to wait")
	}
	inflight = 3 // one finished: its slot is free at once, before the next report
	if sig := judge(def, &e, stated); def.Headroom(sig) != 1 {
		t.Fatalf("headroom %g after a finish, want 1", def.Headroom(sig))
	}
	inflight = 0
	full := loadmon.Report{PolledAt: t0.Add(time.Second), Running: 4, MaxRunning: 4}
	if sig := judge(def, &e, full); def.CanStart(sig) || def.Level(sig) != 1 {
		t.Fatalf("a full engine: can start %v, level %g", def.CanStart(sig), def.Level(sig))
	}
	// Hostile statements are bounded: a huge one is MaxSlots, a negative one none.
	var h loadmon.Estimate
	if sig := judge(def, &h, loadmon.Report{PolledAt: t0, MaxRunning: 1 << 40}); sig.Slots != loadmon.MaxSlots {
		t.Fatalf("slots %d from a huge statement, want %d", sig.Slots, loadmon.MaxSlots)
	}
	if sig := judge(def, &h, loadmon.Report{PolledAt: t0.Add(time.Second), Running: 4, MaxRunning: -4}); sig.SlotsStated || def.Headroom(sig) < 1 {
		t.Fatalf("a negative statement: stated %v headroom %g, want unknown slots and room", sig.SlotsStated, def.Headroom(sig))
	}

	// No statement: full at 4 only once a report shows requests waiting, and then with
	// LearnWaiting more waiting.
	var u loadmon.Estimate
	if sig := judge(def, &u, loadmon.Report{PolledAt: t0, Running: 4}); !def.CanStart(sig) {
		t.Fatal("an engine of unknown batch refused a request")
	}
	sig = judge(def, &u, loadmon.Report{PolledAt: t0.Add(time.Second), Running: 4, Waiting: 1})
	if sig.Slots != 4 || sig.SlotsStated || def.Headroom(sig) != LearnWaiting-1 {
		t.Fatalf("slots %d stated %v headroom %g, want 4 learned and %d", sig.Slots, sig.SlotsStated, def.Headroom(sig), LearnWaiting-1)
	}
	// An explicit MaxWaiting applies to both kinds; a negative one holds none waiting.
	two := Saturation{MaxWaiting: 2}.WithDefaults()
	var e2 loadmon.Estimate
	if sig := judge(two, &e2, full); two.Headroom(sig) != 2 {
		t.Fatalf("headroom %g of a full stated engine with MaxWaiting 2, want 2", two.Headroom(sig))
	}
	none := Saturation{MaxWaiting: -1}.WithDefaults()
	if sig := judge(none, &u, loadmon.Report{PolledAt: t0.Add(2 * time.Second), Running: 4, Waiting: 1}); none.CanStart(sig) {
		t.Fatal("MaxWaiting -1 let an engine of learned batch hold more waiting")
	}
	if none.WithDefaults().MaxWaiting != -1 || def.WithDefaults().MaxWaiting != 0 {
		t.Fatal("WithDefaults is not idempotent on MaxWaiting")
	}
}
