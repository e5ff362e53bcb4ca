package fleet

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
)

func mustSchedule(t *testing.T, w bench.Workload, a bench.Arrivals, l bench.Limits) *bench.Schedule {
	t.Helper()
	s, err := bench.NewSchedule(w, a, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func reportBytes(t *testing.T, rows []bench.Summary) []byte {
	t.Helper()
	var b bytes.Buffer
	r := bench.Report{Title: "determinism", Rows: rows}
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestDeterministic runs the same grid twice, once sequentially and once in parallel, and wants
// byte-identical reports; a different seed must change them.
func TestDeterministic(t *testing.T) {
	x := func(seed uint64, par int) *Experiment {
		return &Experiment{
			Base:     Config{Engines: 4, Seed: seed},
			Policies: []string{"cache_aware", "power_of_two", "random"},
			Gateways: []int{1, 3},
			Workload: bench.NewMultiTurn(seed),
			Arrivals: bench.Arrivals{Rate: 4},
			Limits:   bench.Limits{Duration: 30 * time.Second},
			Seed:     seed,
			Parallel: par,
		}
	}
	a, err := x(1, 1).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	xb := x(1, 2)
	var progress bytes.Buffer
	xb.Progress = &progress
	b, err := xb.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// One line per run, and watching changes nothing (compared with a below).
	if lines := strings.Count(progress.String(), "\n"); lines != 6 || !strings.Contains(progress.String(), "6/6 done") {
		t.Errorf("progress of 6 runs:\n%s", progress.String())
	}
	if !bytes.Equal(reportBytes(t, a), reportBytes(t, b)) {
		t.Fatal("two runs with one seed differ")
	}
	if a[0].OK < 100 || a[0].CachedTokens == 0 {
		t.Fatalf("run too small to mean anything: %+v", a[0])
	}
	c, err := x(2, 2).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(reportBytes(t, a), reportBytes(t, c)) {
		t.Fatal("seeds 1 and 2 gave the same report")
	}
}

// queueEngine is an engine that serves one request at a time in exactly k steps of step each:
// with Poisson arrivals it is an M/D/1 queue.
func queueEngine(step time.Duration) engine.Config {
	return engine.Config{MaxRunning: 1, PrefillTPS: 1e12, DecodeBase: step, DecodePerReq: time.Nanosecond}
}

func trivialWorkload(k int) *bench.SharedPrefix {
	w := bench.NewSharedPrefix(3)
	w.OutputTokens = k
	return w.Init()
}

// TestQueueingClosedForm checks the simulator against queueing theory on a trivial fleet whose
// engines serve one request at a time in a fixed time S = k steps (the first token after one
// step).
//
//   - random, open loop: each of W engines is an M/D/1 queue at λ/W; Pollaczek–Khinchine gives
//     the mean wait Wq = ρS / (2(1−ρ)); mean TTFT = Wq + step, mean E2E = Wq + S. Tolerance 8 %.
//   - round_robin, open loop, one engine: the same M/D/1 queue. Tolerance 8 %.
//   - round_robin, closed loop of C = 2W sessions without think time: every engine always holds
//     two requests, so throughput is W/S and, after the first round, TTFT is S + step and E2E
//     2S (the closed-network law E2E = C·S/W). Tolerance 1 %.
func TestQueueingClosedForm(t *testing.T) {
	const step = 10 * time.Millisecond
	const k = 10
	S := (k * step).Seconds()
	pk := func(lambdaPerEngine float64) (ttft, e2e float64) {
		rho := lambdaPerEngine * S
		wq := rho * S / (2 * (1 - rho))
		return (wq + step.Seconds()) * 1000, (wq + S) * 1000
	}
	open := []struct {
		name    string
		policy  string
		engines int
		rate    float64
	}{
		{"random M/D/1 x4 at rho 0.6", "random", 4, 24},
		{"round_robin M/D/1 x1 at rho 0.7", "round_robin", 1, 7},
	}
	for _, tc := range open {
		t.Run(tc.name, func(t *testing.T) {
			sched := mustSchedule(t, trivialWorkload(k), bench.Arrivals{Rate: tc.rate}, bench.Limits{Duration: 2000 * time.Second})
			s, err := Run(context.Background(), Config{Engines: tc.engines, Policy: tc.policy, Engine: queueEngine(step), Seed: 5}, sched)
			if err != nil {
				t.Fatal(err)
			}
			wantTTFT, wantE2E := pk(tc.rate / float64(tc.engines))
			t.Logf("mean TTFT %.1f ms (theory %.1f), E2E %.1f ms (theory %.1f), %d requests", s.TTFTMean, wantTTFT, s.E2EMean, wantE2E, s.OK)
			if rel(s.TTFTMean, wantTTFT) > 0.08 || rel(s.E2EMean, wantE2E) > 0.08 {
				t.Fatalf("mean TTFT %.1f ms E2E %.1f ms, want %.1f and %.1f (±8%%) over %d requests", s.TTFTMean, s.E2EMean, wantTTFT, wantE2E, s.OK)
			}
		})
	}
	t.Run("round_robin closed loop", func(t *testing.T) {
		const w = 4
		sched := mustSchedule(t, trivialWorkload(k), bench.Arrivals{Concurrency: 2 * w}, bench.Limits{Duration: 200 * time.Second})
		s, err := Run(context.Background(), Config{Engines: w, Policy: "round_robin", Engine: queueEngine(step), Seed: 5}, sched)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%.2f req/s, TTFT p50 %.1f ms, E2E p50 %.1f ms", s.ReqPerSec, s.TTFTP50, s.E2EP50)
		if rel(s.ReqPerSec, w/S) > 0.01 || rel(s.TTFTP50, (S+step.Seconds())*1000) > 0.01 || rel(s.E2EP50, 2*S*1000) > 0.01 {
			t.Fatalf("%.2f req/s, TTFT p50 %.1f ms, E2E p50 %.1f ms; want %.2f, %.1f, %.1f", s.ReqPerSec, s.TTFTP50, s.E2EP50, w/S, (S+step.Seconds())*1000, 2*S*1000)
		}
	})
}

func rel(got, want float64) float64 { return math.Abs(got-want) / want }

func TestLoadModes(t *testing.T) {
	run := func(gws int, mode loadmon.Mode) bench.Summary {
		sched := mustSchedule(t, trivialWorkload(32), bench.Arrivals{Rate: 36}, bench.Limits{Duration: 120 * time.Second})
		s, err := Run(context.Background(), Config{Engines: 8, Gateways: gws, Policy: "power_of_two", LoadMode: mode, Engine: queueEngine(5 * time.Millisecond), Seed: 9}, sched)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// One gateway sends everything, so at each poll the backlog equals its in-flight count and
	// the effective load is exactly the local count: identical decisions, identical results.
	eff, loc := run(1, loadmon.ModeEffective), run(1, loadmon.ModeLocal)
	if eff.TTFTP99 != loc.TTFTP99 || eff.E2EMean != loc.E2EMean {
		t.Fatalf("one gateway: effective %+v differs from local %+v", eff, loc)
	}
	// Trusting a snapshot up to a second old herds every pick onto the engine that looked least
	// loaded at the poll.
	snap := run(1, loadmon.ModeSnapshot)
	t.Logf("one gateway p99 TTFT: local %.1f ms, snapshot %.1f ms", loc.TTFTP99, snap.TTFTP99)
	if !(snap.TTFTP99 > 2*loc.TTFTP99) {
		t.Fatalf("snapshot-only p99 %.1f ms not far worse than local %.1f ms", snap.TTFTP99, loc.TTFTP99)
	}
	if eff.LoadMode != "effective" || snap.Label != "power_of_two/snapshot" {
		t.Fatalf("labels %q %q", eff.LoadMode, snap.Label)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown policy", Config{Policy: "nope"}, "unknown policy"},
		{"negative engines", Config{Engines: -1}, "engines"},
		{"too many gateways", Config{Gateways: 1000}, "gateways"},
		{"fast polls", Config{PollInterval: time.Microsecond}, "poll interval"},
		{"stale before poll", Config{PollInterval: time.Second, StaleAfter: time.Millisecond}, "stale-after"},
		{"bad engine", Config{Engine: engine.Config{MaxRunning: -1}}, "max running"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sched := mustSchedule(t, trivialWorkload(1), bench.Arrivals{Rate: 1}, bench.Limits{Requests: 1})
			_, err := Run(context.Background(), tc.cfg, sched)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := ParseSpread("sideways"); err == nil {
		t.Fatal("bad spread accepted")
	}
}

func TestSessionSpreadKeepsConversationOnOneGateway(t *testing.T) {
	// With session spread, a conversation's turns all reach one replica, whose tree saw the
	// earlier turns: multi-turn hit rate at 4 gateways must beat uniform spread.
	run := func(sp Spread) bench.Summary {
		sched := mustSchedule(t, bench.NewMultiTurn(2), bench.Arrivals{Rate: 3}, bench.Limits{Duration: 60 * time.Second})
		s, err := Run(context.Background(), Config{Engines: 8, Gateways: 4, Policy: "cache_aware", Spread: sp, Seed: 3}, sched)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	uni, ses := run(SpreadUniform), run(SpreadSession)
	t.Logf("hit rate uniform %.3f, session %.3f", uni.HitRate, ses.HitRate)
	if !(ses.HitRate > uni.HitRate) {
		t.Fatalf("session spread hit rate %.3f not above uniform %.3f", ses.HitRate, uni.HitRate)
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sched := mustSchedule(t, trivialWorkload(4), bench.Arrivals{Rate: 100}, bench.Limits{Duration: time.Hour})
	if _, err := Run(ctx, Config{}, sched); err != context.Canceled {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

func TestTraceReplayKeepsRecordedTimes(t *testing.T) {
	es := []bench.TraceEntry{
		{Arrival: 0, PromptTokens: 400, PrefixID: "a", PrefixTokens: 300, OutputTokens: 8},
		{Arrival: 10, PromptTokens: 400, PrefixID: "a", PrefixTokens: 300, OutputTokens: 8},
		{Arrival: 20, Prompt: "a prompt of its own", OutputTokens: 8},
	}
	run := func(speedup float64) bench.Summary {
		sched := mustSchedule(t, bench.NewTrace(es, 1), bench.Arrivals{Speedup: speedup}, bench.Limits{})
		s, err := Run(context.Background(), Config{Engines: 1, Policy: "round_robin"}, sched)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := run(0)
	if s.OK != 3 || s.SpanSec < 20 || s.SpanSec > 21 {
		t.Fatalf("ok %d over %.3f s, want 3 over just above 20 s", s.OK, s.SpanSec)
	}
	// The second request finds the first one's 300-token prefix cached (in whole 16-token blocks).
	if s.CachedTokens < 288 || s.CachedTokens > 300 {
		t.Fatalf("cached %d tokens, want the shared prefix's 288–300", s.CachedTokens)
	}
	if fast := run(10); fast.SpanSec < 2 || fast.SpanSec > 3 {
		t.Fatalf("at 10× the trace spans %.3f s, want just above 2 s", fast.SpanSec)
	}
}

// TestPrefillCountersReachTheReports: with Config.PrefillCounters each gateway reads every busy
// engine's prompt prefill rate from its counters, as the load monitor reads vLLM's: on one-shot
// 4,000-token prompts at 4,000 tokens/s (half the default speed), the rate in the reports is the
// engine's, within 20 % (a prompt's first chunk may share a step with another's last); without
// the counters the reports carry none.
func TestPrefillCountersReachTheReports(t *testing.T) {
	for _, counted := range []bool{true, false} {
		w := bench.NewLongContext(1)
		w.Tenants, w.ContextWords = 200, 3000 // each prompt new to its engine: its prefill is all of it
		sched := mustSchedule(t, w.Init(), bench.Arrivals{Rate: 0.5}, bench.Limits{Duration: 30 * time.Second})
		eng := engine.DefaultConfig()
		eng.PrefillTPS = 4000
		_, s, err := run(context.Background(), Config{Engines: 2, Policy: "least_load", Engine: eng, Seed: 3, PrefillCounters: counted}, sched)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range s.gws[0].reports {
			switch {
			case counted && (r.PrefillRate < 0.8*4000 || r.PrefillRate > 1.2*4000):
				t.Errorf("engine %d: prefill rate %.0f from its counters, want 4000 ± 20 %%", i, r.PrefillRate)
			case !counted && r.PrefillRate != 0:
				t.Errorf("engine %d: prefill rate %.0f without counters, want none", i, r.PrefillRate)
			}
		}
	}
}
