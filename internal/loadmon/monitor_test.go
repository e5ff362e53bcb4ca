package loadmon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// hits counts requests per path of a fake worker.
type hits struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hits) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		if h.n == nil {
			h.n = map[string]int{}
		}
		h.n[r.URL.Path]++
		h.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (h *hits) get(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[path]
}

// serveBody answers every request with status and body.
func serveBody(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// fakeWorker starts a loopback server with routes and returns a ready worker for it.
func fakeWorker(t *testing.T, spec worker.Spec, routes map[string]http.Handler) (*worker.Worker, *hits) {
	t.Helper()
	mux := http.NewServeMux()
	for p, h := range routes {
		mux.Handle(p, h)
	}
	h := &hits{}
	srv := httptest.NewServer(h.wrap(mux))
	t.Cleanup(srv.Close)
	spec.URL = srv.URL
	w, err := worker.New(spec, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	return w, h
}

// countingHandler counts slog records by message.
type countingHandler struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *countingHandler) WithGroup(string) slog.Handler            { return c }
func (c *countingHandler) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r.Message]++
	return nil
}

func (c *countingHandler) count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for m, k := range c.n {
		if strings.HasPrefix(m, prefix) {
			n += k
		}
	}
	return n
}

// testMonitor returns a monitor of reg with a fake clock and a log counter.
func testMonitor(t *testing.T, reg *worker.Registry, cfg Config) (*Monitor, *testutil.Clock, *countingHandler) {
	t.Helper()
	clk := testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	logs := &countingHandler{}
	cfg.Now, cfg.Logger = clk.Now, slog.New(logs)
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second / 5 // generous: the race detector slows loopback down
	}
	m := New(reg, cfg)
	t.Cleanup(m.Stop)
	return m, clk, logs
}

func addWorkers(t *testing.T, reg *worker.Registry, ws ...*worker.Worker) {
	t.Helper()
	for _, w := range ws {
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	idleLoads    = `{"loads":[{"num_running_reqs":0,"num_waiting_reqs":0,"num_waiting_uncached_tokens":0,"token_usage":0,"gen_throughput":0}]}`
	busyLoads    = `{"loads":[{"num_running_reqs":6,"num_waiting_reqs":4,"num_waiting_uncached_tokens":2048,"token_usage":0.5,"gen_throughput":1000}]}`
	modelsVLLM   = `{"object":"list","data":[{"id":"llama","object":"model","owned_by":"vllm"}]}`
	modelsSGLang = `{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"sglang"}]}`
)

func TestPollSources(t *testing.T) {
	notFound := http.NotFoundHandler()
	tests := []struct {
		name        string
		spec        worker.Spec
		routes      map[string]http.Handler
		wantSource  Source
		wantRuntime string
		wantBacklog int64
		// per path, the requests expected after two rounds
		wantHits map[string]int
	}{
		{"native /v1/loads, runtime unknown", worker.Spec{},
			map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads), "/v1/models": serveBody(200, `{"data":[{"owned_by":"acme"}]}`)},
			SourceLoads, "", 10, map[string]int{"/v1/loads": 2, "/v1/models": 1, "/metrics": 0}},
		{"sglang without /v1/loads falls back to /metrics, then goes there first", worker.Spec{Runtime: "sglang"},
			map[string]http.Handler{"/v1/loads": notFound, "/metrics": serveBody(200, sglangOldMetrics)},
			SourceMetrics, RuntimeSGLang, 15, map[string]int{"/v1/loads": 1, "/metrics": 2, "/v1/models": 0}},
		{"registered vllm asks only /metrics", worker.Spec{Runtime: "vllm"},
			map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads), "/metrics": serveBody(200, vllmMetrics)},
			SourceMetrics, RuntimeVLLM, 13, map[string]int{"/v1/loads": 0, "/metrics": 2, "/v1/models": 0}},
		{"runtime label", worker.Spec{Labels: map[string]string{"runtime": "vLLM"}},
			map[string]http.Handler{"/metrics": serveBody(200, vllmOldMetrics)},
			SourceMetrics, RuntimeVLLM, 3, map[string]int{"/v1/loads": 0, "/metrics": 2, "/v1/models": 0}},
		{"vllm learned from /v1/models owned_by", worker.Spec{},
			map[string]http.Handler{"/v1/models": serveBody(200, modelsVLLM), "/metrics": serveBody(200, vllmMetrics)},
			SourceMetrics, RuntimeVLLM, 13, map[string]int{"/v1/models": 1, "/v1/loads": 0, "/metrics": 2}},
		{"sglang learned from /v1/models uses /v1/loads", worker.Spec{},
			map[string]http.Handler{"/v1/models": serveBody(200, modelsSGLang), "/v1/loads": serveBody(200, busyLoads)},
			SourceLoads, RuntimeSGLang, 10, map[string]int{"/v1/models": 1, "/v1/loads": 2, "/metrics": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := worker.NewRegistry()
			m, _, _ := testMonitor(t, reg, Config{})
			w, h := fakeWorker(t, tt.spec, tt.routes)
			addWorkers(t, reg, w)
			release := w.Acquire()
			defer release()
			m.PollOnce(t.Context())
			m.PollOnce(t.Context())
			e, ok := m.Snapshot().Entry(w.ID)
			if !ok {
				f, _ := m.Snapshot().Failure(w.ID)
				t.Fatalf("no entry; failure %+v", f)
			}
			if e.Source != tt.wantSource || e.Runtime != tt.wantRuntime || e.Report.Backlog() != tt.wantBacklog {
				t.Fatalf("entry source %v runtime %q backlog %d, want %v %q %d", e.Source, e.Runtime, e.Report.Backlog(),
					tt.wantSource, tt.wantRuntime, tt.wantBacklog)
			}
			if e.Report.InflightAtPoll != 1 {
				t.Fatalf("InflightAtPoll = %d, want 1", e.Report.InflightAtPoll)
			}
			if got := w.Runtime(); tt.spec.Runtime == "" && tt.spec.Labels == nil && got != tt.wantRuntime {
				t.Fatalf("learned runtime %q, want %q", got, tt.wantRuntime)
			}
			for p, n := range tt.wantHits {
				if got := h.get(p); got != n {
					t.Errorf("%s hit %d times, want %d", p, got, n)
				}
			}
			// Two more requests in flight since the poll: the backlog grows by them.
			r2 := w.Acquire()
			defer r2()
			r3 := w.Acquire()
			defer r3()
			if got, want := m.Load(w), tt.wantBacklog+2; got != want {
				t.Fatalf("Load = %d, want %d", got, want)
			}
		})
	}
}

func TestPollFailuresFallBackToLocal(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	huge := `{"loads":[` + strings.Repeat(" ", 8<<10) + `]}`
	tests := []struct {
		name   string
		spec   worker.Spec
		routes map[string]http.Handler
	}{
		{"500 everywhere", worker.Spec{}, map[string]http.Handler{"/": serveBody(500, "oops")}},
		{"404 everywhere", worker.Spec{}, map[string]http.Handler{}},
		{"garbage bodies", worker.Spec{}, map[string]http.Handler{"/": serveBody(200, "\x00\x01garbage{{")}},
		{"json without loads, metrics without gauges", worker.Spec{},
			map[string]http.Handler{"/v1/loads": serveBody(200, `{"ok":true}`), "/metrics": serveBody(200, "up 1\n")}},
		{"truncated body", worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/": http.HandlerFunc(
			func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Length", "4096")
				io.WriteString(w, busyLoads[:30]) // the server hangs up after 30 of 4096 bytes
			})}},
		{"huge body, chunked", worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/": http.HandlerFunc(
			func(w http.ResponseWriter, _ *http.Request) {
				for i := 0; i < len(huge); i += 1000 {
					io.WriteString(w, huge[i:min(i+1000, len(huge))])
					w.(http.Flusher).Flush()
				}
			})}},
		{"huge body, with length", worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/": serveBody(200, huge)}},
		{"timeout", worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/": http.HandlerFunc(
			func(_ http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-block:
				}
			})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := worker.NewRegistry()
			// The healthy worker's first poll (a dial and a request over loopback, milliseconds)
			// must end within the timeout too: a second, not the 100 ms a loaded machine missed.
			m, _, _ := testMonitor(t, reg, Config{MaxBody: 4 << 10, Timeout: time.Second})
			w, _ := fakeWorker(t, tt.spec, tt.routes)
			good, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads)})
			addWorkers(t, reg, w, good)
			defer w.Acquire()()
			defer w.Acquire()()
			m.PollOnce(t.Context())
			s := m.Snapshot()
			if e, ok := s.Entry(w.ID); ok {
				t.Fatalf("failing worker has an entry: %+v", e)
			}
			f, ok := s.Failure(w.ID)
			if !ok || f.Err == "" || f.Consecutive != 1 {
				t.Fatalf("failure = %+v, %v; want one recorded failure", f, ok)
			}
			if _, ok := m.Report(w); ok {
				t.Fatal("Report ok for a failing worker")
			}
			if got := m.Load(w); got != 2 {
				t.Fatalf("Load = %d, want local 2", got)
			}
			if got := m.Load(good); got != 10 {
				t.Fatalf("a healthy worker polled in the same round: Load = %d, want 10", got)
			}
		})
	}
}

func TestStaleEntryFallsBackToLocal(t *testing.T) {
	reg := worker.NewRegistry()
	m, clk, _ := testMonitor(t, reg, Config{Interval: time.Second})
	w, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads)})
	addWorkers(t, reg, w)
	defer w.Acquire()()
	m.PollOnce(t.Context())
	tests := []struct {
		advance   time.Duration
		wantLoad  int64
		wantFresh bool
	}{
		{0, 10, true},
		{3 * time.Second, 10, true}, // exactly StaleAfter old still counts
		{time.Nanosecond, 1, false},
		{time.Hour, 1, false},
	}
	for _, tt := range tests {
		clk.Advance(tt.advance)
		t.Run(fmt.Sprintf("age %v", clk.Now().Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))), func(t *testing.T) {
			if got := m.Load(w); got != tt.wantLoad {
				t.Fatalf("Load = %d, want %d", got, tt.wantLoad)
			}
			if _, ok := m.Report(w); ok != tt.wantFresh {
				t.Fatalf("Report ok = %v, want %v", ok, tt.wantFresh)
			}
			rows := m.WorkerLoads()
			if len(rows) != 1 || rows[0].Fresh != tt.wantFresh || rows[0].Effective != tt.wantLoad || rows[0].Entry == nil {
				t.Fatalf("WorkerLoads = %+v", rows)
			}
		})
	}
}

func TestFlappingWorker(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, logs := testMonitor(t, reg, Config{})
	var fail atomic.Bool
	w, _ := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/v1/loads": http.HandlerFunc(
		func(rw http.ResponseWriter, r *http.Request) {
			if fail.Load() {
				http.Error(rw, "flap", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(rw, busyLoads)
		})})
	addWorkers(t, reg, w)
	// ok, fail ×3, ok, fail, ok: two failing streaks, two recoveries.
	steps := []bool{false, true, true, true, false, true, false}
	for i, failing := range steps {
		fail.Store(failing)
		m.PollOnce(t.Context())
		_, ok := m.Report(w)
		if ok == failing {
			t.Fatalf("step %d (failing %v): fresh report %v", i, failing, ok)
		}
		want := int64(10)
		if failing {
			want = 0
		}
		if got := m.Load(w); got != want {
			t.Fatalf("step %d: Load = %d, want %d", i, got, want)
		}
	}
	if f, ok := m.Snapshot().Failure(w.ID); ok {
		t.Fatalf("recovered worker still has a failure: %+v", f)
	}
	if got := logs.count("load poll failing"); got != 2 {
		t.Errorf("failing logged %d times, want once per streak (2)", got)
	}
	if got := logs.count("load poll recovered"); got != 2 {
		t.Errorf("recovered logged %d times, want 2", got)
	}
}

func TestFollowsWorkerSet(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	routes := map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads)}
	a, _ := fakeWorker(t, worker.Spec{}, routes)
	b, _ := fakeWorker(t, worker.Spec{}, routes)
	pending, pendingHits := fakeWorker(t, worker.Spec{}, routes)
	pending.SetHealth(worker.Pending)
	addWorkers(t, reg, a, pending)
	m.PollOnce(t.Context())
	if got := m.Snapshot().IDs(); len(got) != 1 || got[0] != a.ID {
		t.Fatalf("entries %v, want only the ready worker", got)
	}
	if pendingHits.get("/v1/loads") != 0 {
		t.Fatal("a pending worker was polled")
	}

	addWorkers(t, reg, b) // added
	pending.SetHealth(worker.Ready)
	m.PollOnce(t.Context())
	if got := m.Snapshot().Len(); got != 3 {
		t.Fatalf("%d entries after add and ready, want 3", got)
	}

	a.SetHealth(worker.NotReady) // health change: no entry from the next round on
	if _, err := reg.Remove(b.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Snapshot().Entry(b.ID); ok {
		t.Fatal("removed worker keeps its entry until the next round")
	}
	m.PollOnce(t.Context())
	if got := m.Snapshot().IDs(); len(got) != 1 || got[0] != pending.ID {
		t.Fatalf("entries %v, want only %s", got, pending.ID)
	}
	m.pollMu.Lock()
	states := len(m.states)
	m.pollMu.Unlock()
	if states != 2 {
		t.Fatalf("%d poll states kept, want 2 (removed worker's dropped)", states)
	}
}

func TestKeepAlive(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(serveBody(200, busyLoads))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	w, err := worker.New(worker.Spec{URL: srv.URL, Runtime: "sglang"}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	addWorkers(t, reg, w)
	for range 5 {
		m.PollOnce(t.Context())
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("5 polls opened %d connections, want 1 (keep-alive)", got)
	}
}

func TestReadersDuringPolls(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	var ws []*worker.Worker
	for range 8 {
		w, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/v1/loads": serveBody(200, busyLoads)})
		addWorkers(t, reg, w)
		ws = append(ws, w)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			for ctx.Err() == nil {
				if l := m.Load(w); l != 0 && l != 10 {
					t.Errorf("Load = %d, want 0 or 10", l)
					return
				}
				_ = m.WorkerLoads()
			}
		})
	}
	for range 5 {
		m.PollOnce(t.Context())
	}
	cancel()
	wg.Wait()
}

func TestConcurrencyBound(t *testing.T) {
	const limit, workers = 3, 10
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{Concurrency: limit})
	var cur, peak atomic.Int32
	full := make(chan struct{}) // closed once `limit` polls are in the handler at once
	var once sync.Once
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		defer cur.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n >= limit {
			once.Do(func() { close(full) })
		}
		select { // the first polls wait until the bound is reached, so the peak is exact
		case <-full:
		case <-r.Context().Done():
		}
		io.WriteString(rw, busyLoads)
	})
	for range workers {
		w, _ := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/v1/loads": h})
		addWorkers(t, reg, w)
	}
	m.PollOnce(t.Context())
	if got := m.Snapshot().Len(); got != workers {
		t.Fatalf("%d entries, want %d", got, workers)
	}
	if got := peak.Load(); got != limit {
		t.Fatalf("peak concurrent polls %d, want exactly %d", got, limit)
	}
}

func TestRuntimeProbeRetry(t *testing.T) {
	reg := worker.NewRegistry()
	m, clk, _ := testMonitor(t, reg, Config{Interval: time.Second})
	var modelsUp atomic.Bool
	w, h := fakeWorker(t, worker.Spec{}, map[string]http.Handler{
		"/v1/models": http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			if !modelsUp.Load() {
				http.Error(rw, "starting", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(rw, modelsVLLM)
		}),
		"/metrics": serveBody(200, vllmMetrics),
	})
	addWorkers(t, reg, w)
	steps := []struct {
		advance   time.Duration
		modelsUp  bool
		wantProbe int // /v1/models requests so far
	}{
		{0, false, 1},                // probe fails: unknown runtime, /v1/loads then /metrics
		{time.Second, true, 1},       // no probe again before 10 intervals
		{9 * time.Second, true, 2},   // probe retried, runtime learned
		{100 * time.Second, true, 2}, // learned: never probed again
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		modelsUp.Store(s.modelsUp)
		m.PollOnce(t.Context())
		if got := h.get("/v1/models"); got != s.wantProbe {
			t.Fatalf("step %d: %d probes, want %d", i, got, s.wantProbe)
		}
		if _, ok := m.Report(w); !ok {
			t.Fatalf("step %d: no report; /metrics works whatever the runtime", i)
		}
	}
	if w.Runtime() != RuntimeVLLM {
		t.Fatalf("runtime %q, want vllm", w.Runtime())
	}
}

func TestStopCancelsPollsInFlight(t *testing.T) {
	reg := worker.NewRegistry()
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	w, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/metrics": http.HandlerFunc(
		func(_ http.ResponseWriter, r *http.Request) {
			select {
			case arrived <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})})
	addWorkers(t, reg, w)
	// A poll that would block for a minute unless Stop cancels it.
	m, _, _ := testMonitor(t, reg, Config{Interval: 2 * time.Minute, Timeout: time.Minute})
	m.Start(t.Context())
	testutil.Recv(t, arrived, "the poll at the worker")
	start := time.Now()
	m.Stop()
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Stop took %v: the poll in flight was not cancelled", took)
	}
	if s := m.Snapshot(); s.Len() != 0 || s.Round != 0 {
		t.Fatalf("a cancelled round was published: round %d, %d entries", s.Round, s.Len())
	}
}

func TestVLLMThroughputFromCounter(t *testing.T) {
	reg := worker.NewRegistry()
	m, clk, _ := testMonitor(t, reg, Config{Interval: time.Second})
	var total atomic.Int64
	w, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/metrics": http.HandlerFunc(
		func(rw http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(rw, "%svllm:generation_tokens_total{engine=\"0\"} %d.0\n", vllmMetrics, total.Load())
		})})
	addWorkers(t, reg, w)
	steps := []struct {
		name    string
		advance time.Duration
		total   int64
		want    float64 // GenThroughput; 0: no token data
	}{
		{"first poll: no rate yet", 0, 1000, 0},
		{"2000 tokens in 1s", time.Second, 3000, 2000},
		{"500 tokens in 0.5s", time.Second / 2, 3500, 1000},
		{"restarted worker: counter went back", time.Second, 200, 0},
		{"after a restart", 2 * time.Second, 1200, 500},
		{"polls too far apart", 4 * time.Second, 5200, 0},
		{"idle", time.Second, 5200, -1}, // token data with zero throughput
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		total.Store(s.total)
		m.PollOnce(t.Context())
		r, ok := m.Report(w)
		if !ok {
			t.Fatalf("%s: no report", s.name)
		}
		switch {
		case s.want == 0 && r.HasTokenData:
			t.Fatalf("%s: token data %+v, want none", s.name, r)
		case s.want == -1 && (!r.HasTokenData || r.GenThroughput != 0):
			t.Fatalf("%s: %+v, want token data with zero throughput", s.name, r)
		case s.want > 0 && (!r.HasTokenData || math.Abs(r.GenThroughput-s.want) > 1e-9):
			t.Fatalf("%s: throughput %v (token data %v), want %v", s.name, r.GenThroughput, r.HasTokenData, s.want)
		}
	}
}
