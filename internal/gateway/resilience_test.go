package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

func scrape(t *testing.T, g *testGateway) string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// TestWorkerOverrideLabels checks that per-worker breaker and health labels are validated at
// registration and applied to that worker only.
func TestWorkerOverrideLabels(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	f := newFakeWorker(t, "m")
	cases := []struct {
		name   string
		body   string
		status int
	}{
		{name: "bad breaker timeout", body: `{"url":"` + f.URL + `","labels":{"cb_timeout":"soon"}}`, status: 400},
		{name: "bad health threshold", body: `{"url":"` + f.URL + `","labels":{"health_failure_threshold":"0"}}`, status: 400},
		{name: "bad health path", body: `{"url":"` + f.URL + `","labels":{"health_check_path":"health"}}`, status: 400},
		{name: "good", body: `{"url":"` + f.URL + `","labels":{"cb_failure_threshold":"1","cb_timeout":"1h","health_check_interval":"1s"}}`, status: 201},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, raw := adminDo(t, g, http.MethodPost, "/workers", tc.body, "")
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
		})
	}
	w := g.reg.View().All[0]
	if c := w.Breaker.Config(); c.FailureThreshold != 1 || c.OpenTimeout != time.Hour || c.SuccessThreshold != 3 {
		t.Errorf("breaker config %+v: labels not applied over the defaults", c)
	}
}

// TestCircuitOpensAndIsCounted sends a worker that fails every request past its (label-lowered)
// failure threshold: the circuit opens, the transition is counted and logged once, and the
// next client gets a 503 that says why.
func TestCircuitOpensAndIsCounted(t *testing.T) {
	f := newFakeWorker(t, "m")
	f.setHandler(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	cfg := Config{Proxy: proxy.Config{Retry: proxy.RetryConfig{MaxAttempts: 1}}}
	g := newTestGateway(t, cfg, "round_robin")
	g.mustRegister(t, AddWorkerRequest{URL: f.URL, Labels: map[string]string{"cb_failure_threshold": "2"}})
	for i := 0; i < 2; i++ {
		resp := g.post(t, "/v1/chat/completions", `{"model":"m","messages":[]}`)
		resp.Body.Close()
		if resp.StatusCode != 500 {
			t.Fatalf("request %d: status %d, want the worker's 500", i, resp.StatusCode)
		}
	}
	resp := g.post(t, "/v1/chat/completions", `{"model":"m","messages":[]}`)
	e := decodeError(t, resp)
	if resp.StatusCode != 503 || !strings.Contains(e.Message, "1 circuit open") {
		t.Errorf("after the circuit opened: %d %q", resp.StatusCode, e.Message)
	}
	g.waitDone(t, 3)
	wid := g.reg.View().All[0].ID
	wantMetrics(t, g, strings.ReplaceAll(`# HELP kvgate_worker_circuit_transitions_total Circuit-breaker state changes by worker and new state.
# TYPE kvgate_worker_circuit_transitions_total counter
kvgate_worker_circuit_transitions_total{to="open",worker="WID"} 1
# HELP kvgate_worker_circuit_state 1 for the worker's current circuit state (closed, open, half_open).
# TYPE kvgate_worker_circuit_state gauge
kvgate_worker_circuit_state{state="closed",worker="WID"} 0
kvgate_worker_circuit_state{state="half_open",worker="WID"} 0
kvgate_worker_circuit_state{state="open",worker="WID"} 1
`, "WID", wid), "kvgate_worker_circuit_transitions_total", "kvgate_worker_circuit_state")
	if f.requests() != 2 {
		t.Errorf("the worker saw %d requests, want 2 (none once open)", f.requests())
	}
}

// TestClientErrorsNeverOpenTheCircuit sends many requests the worker rejects as the client's
// fault (400) and many the client abandons: the circuit must stay closed.
func TestClientErrorsNeverOpenTheCircuit(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{Breaker: worker.BreakerConfig{FailureThreshold: 2}}, "round_robin", f)
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"bad"}}`)
	})
	for i := 0; i < 5; i++ {
		resp := g.post(t, "/v1/chat/completions", `{"model":"m","messages":[]}`)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Fatalf("status %d, want the worker's 400", resp.StatusCode)
		}
	}
	started := make(chan struct{}, 5)
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-r.Context().Done()
	})
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		testutil.Recv(t, started, "the request at the worker")
		cancel()
		testutil.Recv(t, errc, "the cancelled client's return")
	}
	g.waitDone(t, 10)
	w := g.reg.View().All[0]
	if s := w.Breaker.State(time.Now()); s != worker.Closed {
		t.Errorf("circuit %s after client errors and cancels, want closed", s)
	}
	if n := totalInflight(g.Server); n != 0 {
		t.Errorf("in flight %d", n)
	}
}
