package gateway

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestHotMetricsFollowForgetting: a model that leaves with its only worker, and the same worker
// (same id) registered again, are counted afresh in series that a scrape shows. The hot
// metrics' cached children go with the series forgetModel and forgetWorker delete: a child
// kept in the cache would count the second round into a series no scrape shows, and a series
// kept would add the rounds up.
func TestHotMetricsFollowForgetting(t *testing.T) {
	srv := multiModelServer(t)
	g := newTestGateway(t, Config{}, "cache_aware")
	for round, n := range []int{2, 1} {
		w, err := g.Register(context.Background(), AddWorkerRequest{URL: srv.URL + "/back"})
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			for _, stream := range []bool{false, true} {
				body := `{"model":"back","stream":` + fmt.Sprint(stream) + `,"messages":[{"role":"user","content":"hello there"}]}`
				resp := g.postBounded(t, "/v1/chat/completions", body)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("round %d: status %d", round, resp.StatusCode)
				}
				g.waitDone(t, 1)
			}
		}
		wantMetrics(t, g, fmt.Sprintf(`# HELP kvgate_requests_total Client requests by route, model and status.
# TYPE kvgate_requests_total counter
kvgate_requests_total{model="back",route="/v1/chat/completions",status="200"} %d
# HELP kvgate_policy_selections_total Workers picked, by policy, model and worker.
# TYPE kvgate_policy_selections_total counter
kvgate_policy_selections_total{model="back",policy="cache_aware",worker="%s"} %d
`, 2*n, w.ID, 2*n), "kvgate_requests_total", "kvgate_policy_selections_total")
		if c := histogramCount(t, g, "kvgate_request_duration_seconds", map[string]string{"model": "back", "route": "/v1/chat/completions"}); c != uint64(2*n) {
			t.Errorf("round %d: %d durations, want %d", round, c, 2*n)
		}
		if c := histogramCount(t, g, "kvgate_ttft_seconds", map[string]string{"model": "back"}); c != uint64(n) {
			t.Errorf("round %d: %d TTFTs, want %d (one per stream)", round, c, n)
		}
		if family(t, g, "kvgate_prefix_prediction_error") == nil && family(t, g, "kvgate_prefix_prediction_unverified_total") == nil {
			t.Errorf("round %d: no prediction series", round)
		}
		if _, err := g.reg.Remove(w.ID); err != nil {
			t.Fatal(err)
		}
		if n := countSeries(t, g, func(l map[string]string) bool { return l["model"] == "back" || l["worker"] == w.ID }); n > 0 {
			t.Errorf("round %d: %d series of the model or worker that left", round, n)
		}
	}
}

// TestHotMetricsConcurrent: children created and forgotten from many goroutines at once keep
// every count of the series that stay (run under -race).
func TestHotMetricsConcurrent(t *testing.T) {
	m := newTestGateway(t, Config{}, "round_robin").metrics
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 500 {
				m.observeRequest("/v1/completions", "stays", 200, 0)
			}
		}()
		go func() {
			defer wg.Done()
			for j := range 100 {
				model := fmt.Sprintf("leaves-%d-%d", i, j)
				m.observeRequest("/v1/completions", model, 200, 0)
				m.forgetModel(model)
			}
		}()
	}
	wg.Wait()
	if got := testutilCount(t, m, "stays"); got != 2000 {
		t.Errorf("%v requests counted for the model that stays, want 2000", got)
	}
}

// testutilCount reads kvgate_requests_total for model on /v1/completions with status 200.
func testutilCount(t *testing.T, m *Metrics, model string) float64 {
	t.Helper()
	var n float64
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "kvgate_requests_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					n += s.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// BenchmarkHotMetrics is one routed request's metric updates (request count, duration,
// selection), through the cache and, in the same run, through the vecs' label lookups.
//
//	go test -run XXX -bench HotMetrics -benchmem ./internal/gateway/
func BenchmarkHotMetrics(b *testing.B) {
	router := newRouter(b, "round_robin", policy.DefaultConfig())
	m := newMetrics(worker.NewRegistry(), router, nil)
	w := &worker.Worker{ID: "cecfdd2348be"}
	const route, model, pol = "/v1/chat/completions", "meta-llama/Llama-3.1-8B-Instruct", "cache_aware_hash"
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.observeRequest(route, model, 200, time.Millisecond)
			m.selected(pol, model, w)
		}
	})
	b.Run("vec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.requests.WithLabelValues(route, model, strconv.Itoa(200)).Inc()
			m.duration.WithLabelValues(route, model).Observe(time.Millisecond.Seconds())
			m.selections.WithLabelValues(pol, model, w.ID).Inc()
		}
	})
}
