package policy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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
		{"the default on a cold tree", "sglang", loadmon.ModeEffective, "cache_aware_hash", burst / workers},
		// Without the correction the idle snapshot is trusted until the next poll: stampede.
		{"snapshot-only load stampedes", "vllm", loadmon.ModeSnapshot, "cache_aware", burst},
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
				// PromptBytes as the gateway sets it: the body's length.
				w := p.Pick(context.Background(), ws, &Request{Model: "m", Text: fmt.Sprintf("prompt %d, unlike any other", i), PromptBytes: 4000})
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
		if p.Pick(context.Background(), ws, req) == nil {
			b.Fatal("no pick")
		}
	}
}
