package drills

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/worker"
)

// engine is one simulated inference server on a fixed loopback address that a drill can kill as
// a crash would (listener and every connection closed at once) and start again on the same port.
type engine struct {
	t    *testing.T
	addr string
	cfg  sim.Config

	mu   sync.Mutex
	srv  *sim.Server
	hs   *http.Server
	done chan struct{} // closed when the current Serve returned
}

func startEngine(t *testing.T, cfg sim.Config) *engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{t: t, addr: ln.Addr().String(), cfg: cfg}
	e.serve(ln)
	return e
}

func (e *engine) serve(ln net.Listener) {
	srv := sim.NewServer(e.cfg)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	e.mu.Lock()
	e.srv, e.hs, e.done = srv, hs, done
	e.mu.Unlock()
}

// URL is the engine's base URL; it survives restarts.
func (e *engine) URL() string { return "http://" + e.addr }

// sim returns the running simulated server.
func (e *engine) sim() *sim.Server {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv
}

// kill crashes the engine. Killing a dead engine does nothing.
func (e *engine) kill() {
	e.mu.Lock()
	hs, srv, done := e.hs, e.srv, e.done
	e.hs = nil
	e.mu.Unlock()
	if hs == nil {
		return
	}
	_ = hs.Close()
	srv.Close()
	<-done
}

// restart starts a fresh engine on the same port.
func (e *engine) restart() {
	e.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port was just released; rebinding is normally immediate
		if ln, err = net.Listen("tcp", e.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatalf("restarting the engine on %s: %v", e.addr, err)
	}
	e.serve(ln)
}

// running is the engine's running plus waiting requests now.
func (e *engine) running() int {
	l := e.sim().Load()
	return l.Running + l.Waiting
}

// rigConfig is a drill's gateway settings: drill-speed health checks and breaker timeouts. A
// check's timeout is far longer than its interval: no drill sheds a worker by a check timing out
// (a killed engine refuses at once, a failing one answers 503, a hung one is the breaker's), and
// a 100 ms bound let a loaded machine, three checks in a row, mark a steady worker not ready.
type rigConfig struct {
	engines int
	health  worker.HealthConfig
	breaker worker.BreakerConfig
	proxy   proxy.Config
	labels  map[string]string
}

func defaultRig(engines int) rigConfig {
	return rigConfig{
		engines: engines,
		health:  worker.HealthConfig{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, SuccessThreshold: 2, FailureThreshold: 3},
		breaker: worker.BreakerConfig{FailureThreshold: 10, SuccessThreshold: 3, OpenTimeout: time.Second, HalfOpenProbes: 1, FailureRateThreshold: 0.5, FailureRateWindow: 20},
		proxy:   proxy.Config{RequestTimeout: 30 * time.Second, Retry: proxy.DefaultRetryConfig()},
	}
}

// rig is the gateway on a loopback port in front of engines, with a client and a recorder of the
// gateway's transition logs.
type rig struct {
	t       *testing.T
	engines []*engine
	workers []*worker.Worker // workers[i] serves engines[i]
	gw      *gateway.Server
	api     *httptest.Server
	client  *http.Client
	events  *recorder
}

// newRig starts the engines and the gateway. It registers a goroutine-leak check first, so that
// it runs after every other cleanup.
func newRig(t *testing.T, rc rigConfig) *rig {
	t.Helper()
	checkGoroutines(t)
	r := &rig{t: t, events: newRecorder()}
	for i := 0; i < rc.engines; i++ {
		e := startEngine(t, sim.Config{Seed: uint64(i + 1)})
		r.engines = append(r.engines, e)
		t.Cleanup(e.kill)
	}
	router, err := policy.NewRouter("round_robin", policy.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	cfg := gateway.DefaultConfig()
	cfg.Logger = slog.New(r.events)
	cfg.Health, cfg.Breaker, cfg.Proxy = rc.health, rc.breaker, rc.proxy
	tr := proxy.NewTransport()
	cfg.Proxy.Transport = tr
	t.Cleanup(tr.CloseIdleConnections)
	r.gw = gateway.New(cfg, worker.NewRegistry(), router, nil)
	for _, e := range r.engines {
		w, err := r.gw.Register(context.Background(), gateway.AddWorkerRequest{URL: e.URL(), Labels: rc.labels})
		if err != nil {
			t.Fatal(err)
		}
		r.workers = append(r.workers, w)
	}
	r.gw.Start(context.Background())
	t.Cleanup(r.gw.Stop)
	r.api = httptest.NewServer(r.gw.Handler())
	t.Cleanup(r.api.Close)
	ct := &http.Transport{MaxIdleConnsPerHost: 64}
	r.client = &http.Client{Transport: ct, Timeout: 30 * time.Second}
	t.Cleanup(ct.CloseIdleConnections)
	return r
}

// inflight is the gateway's in-flight count over all workers.
func (r *rig) inflight() int64 {
	var n int64
	for _, w := range r.gw.Registry().View().All {
		n += w.Inflight()
	}
	for _, w := range r.workers { // removed workers too
		if !slices.Contains(r.gw.Registry().View().All, w) {
			n += w.Inflight()
		}
	}
	return n
}

// settle waits, bounded, for the gateway's in-flight count to return to zero and fails if it
// does not. The count drops in deferred code just after a client has its answer, so a short
// bounded poll is the only signal there is.
func (r *rig) settle() {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.inflight() != 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%d requests still in flight at the gateway", r.inflight())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkGoroutines fails the test if, after its cleanups, more goroutines run than before it.
func checkGoroutines(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d before the drill, %d after\n%s", before, n, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// event is one logged health or circuit transition.
type event struct {
	at       time.Time
	kind     string // "health" or "circuit"
	worker   string
	from, to string
}

// recorder is a slog.Handler that keeps the gateway's transition lines and wakes waiters on each.
type recorder struct {
	mu     sync.Mutex
	events []event
	wake   chan struct{} // closed and replaced on every event
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{})} }

func (*recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler     { return r }
func (r *recorder) WithGroup(string) slog.Handler          { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var kind string
	switch rec.Message {
	case "worker health changed":
		kind = "health"
	case "worker circuit changed":
		kind = "circuit"
	default:
		return nil
	}
	ev := event{at: rec.Time, kind: kind}
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "worker":
			ev.worker = a.Value.String()
		case "from":
			ev.from = a.Value.String()
		case "to":
			ev.to = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	r.events = append(r.events, ev)
	close(r.wake)
	r.wake = make(chan struct{})
	r.mu.Unlock()
	return nil
}

// waitFor returns the first event after since matching ok, waiting up to timeout for it.
func (r *recorder) waitFor(since time.Time, timeout time.Duration, ok func(event) bool) (event, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for _, ev := range r.events {
			if !ev.at.Before(since) && ok(ev) {
				r.mu.Unlock()
				return ev, true
			}
		}
		wake := r.wake
		r.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			return event{}, false
		}
	}
}

// count returns how many events match ok.
func (r *recorder) count(ok func(event) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if ok(ev) {
			n++
		}
	}
	return n
}

// shedEvent matches w leaving the routable set: health not ready or circuit open.
func shedEvent(w *worker.Worker) func(event) bool {
	return func(ev event) bool {
		return ev.worker == w.ID && (ev.to == "not_ready" || ev.to == "open")
	}
}

// waitAvailable waits, bounded, until w is routable again (ready, circuit not open).
func (r *rig) waitAvailable(w *worker.Worker, since time.Time, timeout time.Duration) (time.Duration, bool) {
	deadline := time.Now().Add(timeout)
	for !w.Available() {
		// Readmission is a health or circuit transition: wait for the next one.
		left := time.Until(deadline)
		if left <= 0 {
			return 0, false
		}
		r.events.waitFor(time.Now(), min(left, 200*time.Millisecond), func(ev event) bool { return ev.worker == w.ID })
	}
	return time.Since(since), true
}

// scrape returns the gateway's metrics text.
func (r *rig) scrape() string {
	rec := httptest.NewRecorder()
	r.gw.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// metric returns the value of the sample whose line starts with prefix, or 0.
func (r *rig) metric(prefix string) float64 {
	for _, line := range strings.Split(r.scrape(), "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			var v float64
			fmt.Sscan(line[len(prefix)+1:], &v)
			return v
		}
	}
	return 0
}

var errCut = errors.New("response cut without a clear error")

// drain reads and discards a body, returning the read error.
func drain(rc io.ReadCloser) error {
	_, err := io.Copy(io.Discard, rc)
	rc.Close()
	return err
}

// simCfg is an engine's configuration with its own seed.
func simCfg(seed uint64) sim.Config { return sim.Config{Seed: seed} }
