package policy

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// The load monitor is a load view for every load-aware policy.
var _ Loads = (*loadmon.Monitor)(nil)

// reportLoads is a load view with a fixed effective load and report per worker.
type reportLoads map[*worker.Worker]struct {
	load int64
	r    loadmon.Report
	ok   bool
}

func (m reportLoads) Load(w *worker.Worker) int64 { return m[w].load }
func (m reportLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	e := m[w]
	return e.r, e.ok
}

func TestExpectedWait(t *testing.T) {
	tests := []struct {
		name  string
		r     loadmon.Report
		local int64
		tput  float64
		want  float64
	}{
		{"idle", loadmon.Report{HasUncachedTokens: true, GenThroughput: 1000}, 0, 1000, 0},
		{"queued tokens over throughput", loadmon.Report{HasUncachedTokens: true, Waiting: 2, WaitingUncachedTokens: 2000, GenThroughput: 1000}, 0, 1, 2},
		{"sent since poll at the queue's average size", loadmon.Report{HasUncachedTokens: true, Waiting: 2, WaitingUncachedTokens: 2000,
			GenThroughput: 1000, InflightAtPoll: 1}, 4, 1, 5},
		{"sent since poll at the default size", loadmon.Report{HasUncachedTokens: true, GenThroughput: 512}, 3, 1, 3},
		{"finished since poll subtract nothing", loadmon.Report{HasUncachedTokens: true, Waiting: 1, WaitingUncachedTokens: 100,
			GenThroughput: 100, InflightAtPoll: 5}, 0, 1, 1},
		{"waiting without token counts", loadmon.Report{Waiting: 2, GenThroughput: 1024}, 0, 1, 1},
		{"cached queue is no prefill", loadmon.Report{HasUncachedTokens: true, Waiting: 3, GenThroughput: 1000}, 0, 1, 0},
		{"idle throughput uses the fallback", loadmon.Report{HasUncachedTokens: true, Waiting: 1, WaitingUncachedTokens: 500}, 0, 250, 2},
		{"no throughput at all", loadmon.Report{HasUncachedTokens: true, Waiting: 1, WaitingUncachedTokens: 500}, 0, 0, math.Inf(1)},
		{"kv usage half", loadmon.Report{TokenUsage: 0.5, HasUncachedTokens: true}, 0, 1, 0.15},
		{"kv usage clamped below 1", loadmon.Report{TokenUsage: 1, HasUncachedTokens: true}, 0, 1, 0.15 * 0.99 / 0.01},
		{"both terms", loadmon.Report{TokenUsage: 0.9, HasUncachedTokens: true, Waiting: 1, WaitingUncachedTokens: 1000, GenThroughput: 2000}, 0, 1, 0.5 + 1.35},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ExpectedWait(tt.r, tt.local, tt.tput)
			if !(math.Abs(got-tt.want) < 1e-9 || got == tt.want) {
				t.Fatalf("ExpectedWait = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLeastLoadPick(t *testing.T) {
	tok := func(waiting, uncached int64, tput, usage float64) loadmon.Report {
		return loadmon.Report{Waiting: waiting, WaitingUncachedTokens: uncached, GenThroughput: tput, TokenUsage: usage,
			HasTokenData: true, HasUncachedTokens: true}
	}
	type view struct {
		load int64
		r    loadmon.Report
		ok   bool
	}
	tests := []struct {
		name      string
		views     []view
		processed []int // requests finished per worker before the pick
		down      []int // unavailable workers
		want      int   // -1: nil
	}{
		{"least wait beats least load", []view{
			{load: 2, r: tok(2, 8000, 1000, 0.1), ok: true},  // 8 s of prefill queued
			{load: 9, r: tok(9, 900, 3000, 0.1), ok: true},   // many small requests, fast worker: 0.3 s
			{load: 4, r: tok(4, 4000, 1000, 0.1), ok: true}}, // 4 s
			nil, nil, 1},
		{"a nearly full KV cache costs", []view{
			{load: 1, r: tok(0, 0, 1000, 0.95), ok: true}, // 2.85 s of KV pressure
			{load: 3, r: tok(1, 1000, 1000, 0.2), ok: true}},
			nil, nil, 1},
		{"idle worker reporting zero throughput is not infinitely slow", []view{
			{load: 0, r: tok(1, 100, 0, 0), ok: true}, // 100 tokens at the peers' mean 1000/s: 0.1 s
			{load: 1, r: tok(1, 1000, 1000, 0), ok: true}},
			nil, nil, 0},
		{"one worker without token data: all on effective load", []view{
			{load: 5, r: tok(5, 50000, 100, 0), ok: true},
			{load: 3, r: loadmon.Report{Waiting: 3}, ok: true}, // vLLM /metrics: no token data
			{load: 4, r: tok(0, 0, 1000, 0), ok: true}},
			nil, nil, 1},
		{"a stale or failed worker: all on effective load", []view{
			{load: 2, r: tok(0, 0, 1000, 0), ok: true},
			{load: 1, ok: false}},
			nil, nil, 1},
		{"equal waits: lower effective load", []view{
			{load: 3, r: tok(0, 0, 1000, 0), ok: true},
			{load: 2, r: tok(0, 0, 1000, 0), ok: true}},
			nil, nil, 1},
		{"equal wait and load: fewer processed", []view{
			{load: 1, r: tok(0, 0, 1000, 0), ok: true},
			{load: 1, r: tok(0, 0, 1000, 0), ok: true},
			{load: 1, r: tok(0, 0, 1000, 0), ok: true}},
			[]int{3, 1, 2}, nil, 1},
		{"full tie: first candidate", []view{{load: 1}, {load: 1}}, nil, nil, 0},
		{"unavailable skipped", []view{{load: 0}, {load: 5}, {load: 9}}, nil, []int{0}, 1},
		{"none available", []view{{load: 0}}, nil, []int{0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := readyWorkers(t, len(tt.views))
			lv := reportLoads{}
			for i, v := range tt.views {
				lv[ws[i]] = struct {
					load int64
					r    loadmon.Report
					ok   bool
				}{v.load, v.r, v.ok}
			}
			for i, n := range tt.processed {
				for range n {
					ws[i].Acquire()()
				}
			}
			for _, i := range tt.down {
				ws[i].SetHealth(worker.NotReady)
			}
			got := NewLeastLoad(Config{Loads: lv}).Pick(ws, &Request{})
			switch {
			case tt.want < 0 && got != nil:
				t.Fatalf("Pick = %s, want nil", got.ID)
			case tt.want >= 0 && got != ws[tt.want]:
				t.Fatalf("Pick = %v, want worker %d", got, tt.want)
			}
		})
	}
}

func TestLeastLoadRegistered(t *testing.T) {
	for _, name := range []string{"least_load", "leastload", "Least-Load"} {
		t.Run(name, func(t *testing.T) {
			if c, err := Canonical(name); err != nil || c != "least_load" {
				t.Fatalf("Canonical(%q) = %q, %v", name, c, err)
			}
			if !LoadAware(name) {
				t.Fatal("least_load must be load-aware, so that the load monitor runs")
			}
			p, err := New(name, DefaultConfig())
			if err != nil || p.Name() != "least_load" {
				t.Fatalf("New(%q) = %v, %v", name, p, err)
			}
		})
	}
}

// TestBurstAfterIdleSnapshot is the since-poll correction at work: right after a poll that
// says every worker is idle, a burst through one gateway must spread over the workers. The
// workers are real loopback servers polled by a real monitor.
func TestBurstAfterIdleSnapshot(t *testing.T) {
	const (
		workers = 4
		burst   = 32
	)
	idleLoads := `{"loads":[{"num_running_reqs":0,"num_waiting_reqs":0,"num_waiting_uncached_tokens":0,"token_usage":0.01,"gen_throughput":0}]}`
	idleVLLM := "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"
	tests := []struct {
		name    string
		runtime string // "sglang": native /v1/loads with token data; "vllm": /metrics without
		mode    loadmon.Mode
		policy  string
		maxPer  int // the most requests any one worker may get
	}{
		{"least_load on token data", "sglang", loadmon.ModeEffective, "least_load", burst / workers},
		{"least_load on vLLM backlog", "vllm", loadmon.ModeEffective, "least_load", burst / workers},
		{"power_of_two", "vllm", loadmon.ModeEffective, "power_of_two", burst/workers + 3},
		{"cache_aware on a cold tree", "sglang", loadmon.ModeEffective, "cache_aware", burst / workers},
		// Without the correction the idle snapshot is trusted until the next poll: stampede.
		{"snapshot-only load stampedes", "vllm", loadmon.ModeSnapshot, "least_load", burst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("/v1/loads", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, idleLoads) })
			mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, idleVLLM) })
			reg := worker.NewRegistry()
			var ws []*worker.Worker
			for range workers {
				srv := httptest.NewServer(mux)
				t.Cleanup(srv.Close)
				w, err := worker.New(worker.Spec{URL: srv.URL, Runtime: tt.runtime, Models: []string{"m"}}, worker.BreakerConfig{})
				if err != nil {
					t.Fatal(err)
				}
				w.SetHealth(worker.Ready)
				if err := reg.Add(w); err != nil {
					t.Fatal(err)
				}
				ws = append(ws, w)
			}
			mon := loadmon.New(reg, loadmon.Config{Mode: tt.mode, Logger: slog.New(slog.DiscardHandler)})
			t.Cleanup(mon.Stop)
			mon.PollOnce(t.Context())
			if n := mon.Snapshot().Len(); n != workers {
				t.Fatalf("%d snapshot entries, want %d", n, workers)
			}
			cfg := DefaultConfig()
			cfg.Loads, cfg.Rand = mon, seeded(7)
			p, err := New(tt.policy, cfg)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[*worker.Worker]int{}
			for i := range burst {
				w := p.Pick(ws, &Request{Model: "m", Text: fmt.Sprintf("prompt %d, unlike any other", i)})
				defer w.Acquire()() // in flight until the test ends: no poll in between
				counts[w]++
			}
			most := 0
			for _, n := range counts {
				most = max(most, n)
			}
			if most > tt.maxPer || (tt.maxPer == burst && most != burst) {
				t.Fatalf("busiest worker got %d of %d (%v), want at most %d", most, burst, fmt.Sprint(countsList(ws, counts)), tt.maxPer)
			}
		})
	}
}

func countsList(ws []*worker.Worker, counts map[*worker.Worker]int) []int {
	out := make([]int, len(ws))
	for i, w := range ws {
		out[i] = counts[w]
	}
	return out
}

func BenchmarkLeastLoadPick(b *testing.B) {
	ws := readyWorkers(b, 16)
	lv := reportLoads{}
	for i, w := range ws {
		lv[w] = struct {
			load int64
			r    loadmon.Report
			ok   bool
		}{int64(i), loadmon.Report{Waiting: int64(i), WaitingUncachedTokens: int64(100 * i), GenThroughput: 1000,
			TokenUsage: 0.3, HasTokenData: true, HasUncachedTokens: true}, true}
	}
	p := NewLeastLoad(Config{Loads: lv})
	req := &Request{}
	b.ReportAllocs()
	for b.Loop() {
		if p.Pick(ws, req) == nil {
			b.Fatal("no pick")
		}
	}
}
