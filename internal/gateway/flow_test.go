package gateway

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// heldWorker is a fake worker whose answers wait until the test releases them: it reports each
// request's prompt as it arrives.
type heldWorker struct {
	*fakeWorker
	arrived chan string
	release chan struct{}
}

func newHeldWorker(t *testing.T) *heldWorker { return newHeldWorkerOn(t, nil) }

// newHeldWorkerOn is newHeldWorker on the in-memory network mn (nil: loopback).
func newHeldWorkerOn(t *testing.T, mn *testutil.MemNet) *heldWorker {
	h := &heldWorker{fakeWorker: newFakeWorkerOn(t, mn, "m"), arrived: make(chan string, 64), release: make(chan struct{}, 64)}
	h.setHandler(func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &b)
		h.arrived <- b.Messages[0].Content
		select {
		case <-h.release:
		case <-r.Context().Done():
			return
		case <-t.Context().Done():
			// The test is over (failed, with requests still held): let the gateway's server
			// close instead of waiting for a release that will not come.
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(raw)))
		defaultInference(w, r)
	})
	return h
}

// next returns the prompt of the next request the worker received.
func (h *heldWorker) next(t *testing.T) string {
	t.Helper()
	return testutil.Recv(t, h.arrived, "a request to reach the worker")
}

// handOver releases a request h holds, checks that the answer on ch is a 200, and returns the
// prompt of the request the worker receives next.
func (h *heldWorker) handOver(t *testing.T, ch chan *http.Response) string {
	t.Helper()
	h.release <- struct{}{}
	answerOK(t, ch)
	return h.next(t)
}

// flowGateway is a test gateway with flow control on, whose engines each take one request.
func flowGateway(t *testing.T, fc FlowConfig, keys []string, workers ...*fakeWorker) (*testGateway, chan struct{}) {
	t.Helper()
	return flowGatewayOn(t, nil, fc, keys, workers...)
}

// flowGatewayOn is flowGateway on the in-memory network mn (nil: loopback).
func flowGatewayOn(t *testing.T, mn *testutil.MemNet, fc FlowConfig, keys []string, workers ...*fakeWorker) (*testGateway, chan struct{}) {
	t.Helper()
	fc.Enabled = true
	fc.Saturation = flow.Saturation{DefaultSlots: 1, MaxWaiting: -1}
	g := newTestGatewayOn(t, mn, Config{Flow: fc, APIKeys: keys}, "round_robin", workers...)
	queued := make(chan struct{}, 64)
	g.flow.onQueued = func() { queued <- struct{}{} }
	return g, queued
}

func flowBody(prompt string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
}

func waitQueued(t *testing.T, queued chan struct{}) {
	t.Helper()
	testutil.Recv(t, queued, "the request to be queued")
}

// settled checks that nothing is left queued, pending or in flight.
func settled(t *testing.T, g *testGateway) {
	t.Helper()
	if v, _ := metricSum(t, g.Server, "kvgate_queue_requests", nil); v != 0 {
		t.Errorf("kvgate_queue_requests sums to %g", v)
	}
	g.flow.mu.Lock()
	defer g.flow.mu.Unlock()
	if n := g.flow.queued.Load(); n != 0 {
		t.Errorf("%d requests left queued", n)
	}
	for m, mf := range g.flow.models {
		if mf.q.Len() != 0 || mf.q.Bytes() != 0 || mf.pending.Load() != 0 {
			t.Errorf("model %s: queue %d entries, %d bytes, %d pending", m, mf.q.Len(), mf.q.Bytes(), mf.pending.Load())
		}
	}
	if n := totalInflight(g.Server); n != 0 {
		t.Errorf("%d requests left in flight", n)
	}
}

func TestFlowLateBindingPriorityOrder(t *testing.T) {
	hw := newHeldWorker(t)
	g, queued := flowGateway(t, FlowConfig{}, []string{"batch=k1", "ops+priority=k2"}, hw.fakeWorker)
	ctx := context.Background()
	first := g.async(ctx, "/v1/chat/completions", flowBody("A"), "Authorization", "Bearer k1")
	if got := hw.next(t); got != "A" {
		t.Fatalf("first request %q", got)
	}
	low := g.async(ctx, "/v1/chat/completions", flowBody("low"), "Authorization", "Bearer k1", PriorityHeader, "9") // not permitted: ignored
	waitQueued(t, queued)
	high := g.async(ctx, "/v1/chat/completions", flowBody("high"), "Authorization", "Bearer k2", PriorityHeader, "5")
	waitQueued(t, queued)
	if n := hw.requests(); n != 1 {
		t.Fatalf("the worker saw %d requests while saturated, want 1", n)
	}
	if got := hw.handOver(t, first); got != "high" {
		t.Fatalf("after the first finished, %q went; want the permitted high priority", got)
	}
	hw.release <- struct{}{}
	hw.release <- struct{}{}
	if got := hw.next(t); got != "low" {
		t.Fatalf("then %q", got)
	}
	for _, ch := range []chan *http.Response{high, low} {
		answerOK(t, ch)
	}
	g.waitDone(t, 3)
	settled(t, g)
	if _, n := metricSum(t, g.Server, "kvgate_queue_wait_seconds", nil); n < 2 {
		t.Errorf("wait histogram has %d series, want the two tenants'", n)
	}
}

func TestFlowCancelLeavesQueue(t *testing.T) {
	hw := newHeldWorker(t)
	g, queued := flowGateway(t, FlowConfig{}, nil, hw.fakeWorker)
	first := g.async(context.Background(), "/v1/chat/completions", flowBody("A"))
	hw.next(t)
	ctx, cancel := context.WithCancel(context.Background())
	gone := g.async(ctx, "/v1/chat/completions", flowBody("gone"))
	waitQueued(t, queued)
	cancel()
	<-gone
	g.waitDone(t, 1) // the canceled request's handler returned
	if v, _ := metricSum(t, g.Server, "kvgate_queue_canceled_total", nil); v != 1 {
		t.Errorf("canceled %g, want 1", v)
	}
	hw.release <- struct{}{}
	answer(t, first)
	g.waitDone(t, 1)
	settled(t, g)
	if n := hw.requests(); n != 1 {
		t.Errorf("the canceled request reached the worker (%d requests)", n)
	}
}

// TestFlowTimeout429And503: a request queued past the timeout is answered 429 queue_timeout at
// the timeout, to the nanosecond on a synctest bubble's clock; one whose pool lost its last
// worker while it waited is answered 503 then.
func TestFlowTimeout429And503(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const timeout = 50 * time.Millisecond
		hw := newHeldWorkerOn(t, mn)
		g, queued := flowGatewayOn(t, mn, FlowConfig{Config: flow.Config{Timeout: timeout}}, nil, hw.fakeWorker)
		first := g.async(context.Background(), "/v1/chat/completions", flowBody("A"))
		hw.next(t)
		start := time.Now()
		r := answer(t, g.async(context.Background(), "/v1/chat/completions", flowBody("late")))
		if took := time.Since(start); took != timeout {
			t.Errorf("the queued request was answered after %v, want %v", took, timeout)
		}
		if r.StatusCode != 429 || r.Header.Get("Retry-After") != "1" {
			t.Fatalf("timeout: %d Retry-After %q", r.StatusCode, r.Header.Get("Retry-After"))
		}
		if e := decodeError(t, r); e.Code != "queue_timeout" || e.Type != "rate_limit_error" {
			t.Errorf("timeout error %+v", e)
		}
		waitQueued(t, queued)
		// The pool loses its worker while a request waits: 503 at the deadline. The bubble's
		// clock stands still until every goroutine waits, so the request cannot time out
		// before the test takes the worker away.
		ch := g.async(context.Background(), "/v1/chat/completions", flowBody("orphan"))
		waitQueued(t, queued)
		g.reg.View().All[0].SetHealth(worker.NotReady)
		r = answer(t, ch)
		if r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
			t.Fatalf("empty pool: %d Retry-After %q", r.StatusCode, r.Header.Get("Retry-After"))
		}
		if e := decodeError(t, r); e.Code != "no_available_worker" || strings.Contains(e.Message, "127.0.0.1") {
			t.Errorf("empty pool error %+v", e)
		}
		for reason, want := range map[flow.Reason]float64{flow.ReasonTimeout: 1, flow.ReasonNoWorker: 1} {
			if v, _ := metricSum(t, g.Server, "kvgate_queue_shed_total", map[string]string{"reason": string(reason)}); v != want {
				t.Errorf("shed %s = %g, want %g", reason, v, want)
			}
		}
		// The held first request waited for its headers on the worker that went: it is moved
		// off it (proxy/frozen.go) and, with no worker left, answered 503 too.
		hw.release <- struct{}{}
		if s := answerStatus(t, first); s != 503 {
			t.Errorf("the request held on the lost worker: %d, want 503", s)
		}
		g.waitDone(t, 3)
		settled(t, g)
	})
}

// TestFlowQueueFullAndRateLimit: past the queue's bound a request is answered 429 queue_full; a
// tenant's requests past its rate are answered 429 rate_limited before the queue, until its
// bucket refills a second later (on a synctest bubble's clock: a loaded machine's stall cannot
// refill it early).
func TestFlowQueueFullAndRateLimit(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		hw := newHeldWorkerOn(t, mn)
		fc := FlowConfig{Config: flow.Config{MaxRequests: 1, Tenants: []flow.Tenant{{Name: "slow", RequestsPerSecond: 1}}}}
		g, queued := flowGatewayOn(t, mn, fc, []string{"slow=k1", "k2"}, hw.fakeWorker)
		first := g.async(context.Background(), "/v1/chat/completions", flowBody("A"), "Authorization", "Bearer k2")
		hw.next(t)
		second := g.async(context.Background(), "/v1/chat/completions", flowBody("B"), "Authorization", "Bearer k2")
		waitQueued(t, queued)
		code := func(key, prompt string) (string, string) {
			r := g.post(t, "/v1/chat/completions", flowBody(prompt), "Authorization", "Bearer "+key)
			if r.StatusCode != 429 {
				t.Fatalf("%s: status %d, want 429", prompt, r.StatusCode)
			}
			ra := r.Header.Get("Retry-After")
			e := decodeError(t, r)
			if e.Code == "rate_limited" && !strings.Contains(e.Message, `"slow"`) {
				t.Errorf("rate limit error %+v", e)
			}
			return e.Code, ra
		}
		if c, _ := code("k2", "C"); c != "queue_full" {
			t.Fatalf("past the bound: %s", c)
		}
		// The rate limit refuses before the queue: the tenant's second request in a second.
		if c, _ := code("k1", "D"); c != "queue_full" { // it took the token
			t.Fatalf("the tenant's first request: %s, want queue_full", c)
		}
		if c, ra := code("k1", "E"); c != "rate_limited" || ra != "1" {
			t.Fatalf("the tenant's second request in a second: %s Retry-After %q", c, ra)
		}
		time.Sleep(999 * time.Millisecond)
		if c, _ := code("k1", "F"); c != "rate_limited" {
			t.Fatalf("999 ms after its first request: %s, want rate_limited", c)
		}
		time.Sleep(time.Millisecond)
		if c, _ := code("k1", "G"); c != "queue_full" {
			t.Fatalf("a second after its first request: %s, want the token back (queue_full)", c)
		}
		hw.release <- struct{}{}
		hw.release <- struct{}{}
		answerOK(t, first)
		answerOK(t, second)
		g.waitDone(t, 7)
		settled(t, g)
	})
}

func TestFlowShutdownAnswersQueued(t *testing.T) {
	hw := newHeldWorker(t)
	g, queued := flowGateway(t, FlowConfig{}, nil, hw.fakeWorker)
	first := g.async(context.Background(), "/v1/chat/completions", flowBody("A"))
	hw.next(t)
	ch := g.async(context.Background(), "/v1/chat/completions", flowBody("B"))
	waitQueued(t, queued)
	g.Stop()
	if r := answer(t, ch); r.StatusCode != 503 || decodeError(t, r).Code != "shutting_down" {
		t.Fatalf("queued at shutdown: %d", r.StatusCode)
	}
	hw.release <- struct{}{}
	answer(t, first)
	g.waitDone(t, 2)
	settled(t, g)
}

func TestFlowTenantHeader(t *testing.T) {
	f := newFakeWorker(t, "m")
	g, _ := flowGateway(t, FlowConfig{TenantHeader: "X-Tenant"}, nil, f)
	r := g.post(t, "/v1/chat/completions", flowBody("x"), "X-Tenant", "bad tenant!")
	if r.StatusCode != 400 {
		t.Fatalf("invalid tenant header: %d", r.StatusCode)
	}
	r.Body.Close()
	r = g.post(t, "/v1/chat/completions", flowBody("x"), "X-Tenant", "acme", PriorityHeader, "x")
	if r.StatusCode != 200 {
		t.Fatalf("a priority from a client not permitted to set one must be ignored: %d", r.StatusCode)
	}
	r.Body.Close()
	g.waitDone(t, 2)
	if v, n := metricSum(t, g.Server, "kvgate_queue_wait_seconds", map[string]string{"tenant": flow.OtherTenant, "band": "0"}); v != 1 || n != 1 {
		t.Errorf("the admitted request's wait: %g samples in %d series under tenant \"other\"", v, n)
	}
	if _, n := metricSum(t, g.Server, "kvgate_queue_wait_seconds", nil); n != 1 {
		t.Errorf("an unconfigured tenant made %d wait series, want the one \"other\"", n)
	}
	settled(t, g)
}

// fakeCoster is a policy that predicts a fixed time to first token.
type fakeCoster struct {
	policy.Policy
	seconds float64
}

func (f fakeCoster) BestCost(context.Context, []*worker.Worker, *policy.Request) (float64, bool) {
	return f.seconds, true
}

func TestFlowTTFTSLOAdmission(t *testing.T) {
	f := newFakeWorker(t, "m")
	g, _ := flowGateway(t, FlowConfig{}, nil, f)
	pol, _ := g.router.For("m", worker.Regular)
	cands := g.reg.View().Pool("m").Regular
	try := func(slo string, predicted float64) *flowRefusal {
		req, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header.Set(TTFTSLOHeader, slo)
		fr := &flowRequest{model: "m", candidates: cands, pol: fakeCoster{pol, predicted}, preq: &policy.Request{}, bytes: 100}
		var tk flowTicket
		ref := g.flow.admit(req, fr, &tk)
		tk.done()
		return ref
	}
	ref := try("500", 2.3)
	if ref == nil || ref.status != 429 || ref.reason != flow.ReasonSLO || ref.retry < 1700*time.Millisecond {
		t.Fatalf("predicted 2.3s against 500ms: %+v", ref)
	}
	if ref := try("500", 0.2); ref != nil {
		t.Fatalf("predicted 200ms against 500ms refused: %+v", ref)
	}
	if ref := try("soon", 0.2); ref == nil || ref.status != 400 {
		t.Fatalf("malformed SLO: %+v", ref)
	}
	settled(t, g)
}

func TestParseAPIKey(t *testing.T) {
	for in, want := range map[string]apiKey{
		"plain":                 {secret: "plain"},
		"team=s3cret":           {name: "team", secret: "s3cret"},
		"ops+priority=s":        {name: "ops", setPriority: true, secret: "s"},
		"abcd==":                {secret: "abcd=="},
		"=a=b":                  {secret: "a=b"},
		"bad name=x":            {secret: "bad name=x"},
		"ops+admin=x":           {secret: "ops+admin=x"},
		"c2VjcmV0LWtleQ==":      {secret: "c2VjcmV0LWtleQ=="},
		"team=c2VjcmV0LWtleQ==": {name: "team", secret: "c2VjcmV0LWtleQ=="},
	} {
		if got := parseAPIKey(in); got != want {
			t.Errorf("parseAPIKey(%q) = %+v, want %+v", in, got, want)
		}
	}
	ki := newKeyIdentities([]string{"a=1", "b+priority=2", "3"})
	for tok, want := range map[string]struct {
		name string
		prio bool
	}{"1": {"a", false}, "2": {"b", true}, "3": {"", false}, "a=1": {"", false}, "": {"", false}} {
		if n, p := ki.lookup(tok); n != want.name || p != want.prio {
			t.Errorf("lookup(%q) = %q %v", tok, n, p)
		}
	}
}

func FuzzParseAPIKey(f *testing.F) {
	for _, s := range []string{"a=b", "x+priority=y", "==", "=", "abc=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k := parseAPIKey(s)
		if k.name != "" && !flow.ValidTenantName(k.name) {
			t.Fatalf("%q: invalid name %q", s, k.name)
		}
		if k.name == "" && k.secret != s && "="+k.secret != s {
			t.Fatalf("%q: an unnamed key lost bytes: %q", s, k.secret)
		}
	})
}

// TestFlowNoGoroutineLeft checks Start and Stop leave no watcher behind.
func TestFlowWatcherStops(t *testing.T) {
	f := newFakeWorker(t, "m")
	g, _ := flowGateway(t, FlowConfig{}, nil, f)
	ch := make(chan struct{})
	g.flow.s.loads = updatesOnly{ch}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); g.flow.start(context.Background()) }()
	wg.Wait()
	g.flow.stop() // returns only once the watcher has exited
	if g.flow.cancel == nil {
		t.Fatal("the watcher never started")
	}
}

// updatesOnly is a load source with no reports that announces publications on ch.
type updatesOnly struct{ ch chan struct{} }

func (updatesOnly) Load(w *worker.Worker) int64 { return w.Inflight() }
func (updatesOnly) Report(*worker.Worker) (r loadmon.Report, ok bool) {
	return r, false
}
func (u updatesOnly) Updates() <-chan struct{} { return u.ch }

// metricSum sums the samples of the metric name whose labels include match (a histogram counts
// its observations) and returns the sum and the number of series.
func metricSum(t *testing.T, s *Server, name string, match map[string]string) (sum float64, series int) {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range match {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == k && lp.GetValue() == v)
				}
				if !found {
					continue next
				}
			}
			series++
			switch {
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum, series
}

// settableLoads is a load source whose report the test sets: one for every worker, or, in
// byURL, one for a worker's URL.
type settableLoads struct {
	mu    sync.Mutex
	r     loadmon.Report
	byURL map[string]loadmon.Report
}

func (s *settableLoads) Load(w *worker.Worker) int64 { return w.Inflight() }
func (s *settableLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.byURL[w.URL.String()]; ok {
		return r, true
	}
	return s.r, !s.r.PolledAt.IsZero()
}
func (s *settableLoads) Updates() <-chan struct{} { return nil } // never: the test sets reports

func (s *settableLoads) set(r loadmon.Report) {
	s.mu.Lock()
	s.r = r
	s.mu.Unlock()
}

// TestFlowKVFreedBetweenReports: a request this gateway sent finishing frees its KV cache in the
// saturation judgement at once, so a request queued behind a full KV cache is dispatched then,
// with no new load report.
func TestFlowKVFreedBetweenReports(t *testing.T) {
	hw := newHeldWorker(t)
	g, queued := flowGateway(t, FlowConfig{}, nil, hw.fakeWorker)
	g.flow.cfg.Saturation = flow.Saturation{DefaultSlots: 8, MaxKVUsage: 0.8}.WithDefaults()
	loads := &settableLoads{}
	g.flow.s.loads = loads
	t0 := time.Now()
	loads.set(loadmon.Report{PolledAt: t0, MaxTokens: 1000})
	ctx := context.Background()
	big := strings.Repeat("a", 2000) // about 500 tokens of the engine's 1,000
	first := g.async(ctx, "/v1/chat/completions", flowBody(big))
	if got := hw.next(t); got != big {
		t.Fatalf("first request %.10q", got)
	}
	// The engine reports the first request's KV: 0.85, past the bound.
	loads.set(loadmon.Report{PolledAt: t0.Add(time.Millisecond), Running: 1, InflightAtPoll: 1, UsedTokens: 850, TokenUsage: 0.85, MaxTokens: 1000})
	second := g.async(ctx, "/v1/chat/completions", flowBody("B"))
	waitQueued(t, queued)
	if n := hw.requests(); n != 1 {
		t.Fatalf("the worker saw %d requests with its KV cache full, want 1", n)
	}
	if got := hw.handOver(t, first); got != "B" {
		t.Fatalf("after the first finished, %q went; want the queued B", got)
	}
	hw.release <- struct{}{}
	answerOK(t, second)
	g.waitDone(t, 2)
	settled(t, g)
}

// TestFlowPicksAnEngineThatCanStart: with the queue on, a request picks among the engines that
// can start it; one whose KV cache is past the bound is not sent requests it would only queue,
// while another can take them. With every engine full, the queue holds the request.
func TestFlowPicksAnEngineThatCanStart(t *testing.T) {
	full, free := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g, _ := flowGateway(t, FlowConfig{}, nil, full, free)
	g.flow.cfg.Saturation = flow.Saturation{DefaultSlots: 8, MaxKVUsage: 0.8}.WithDefaults()
	now := time.Now()
	loads := &settableLoads{r: loadmon.Report{PolledAt: now, MaxTokens: 1000}, byURL: map[string]loadmon.Report{
		full.URL: {PolledAt: now, Running: 3, UsedTokens: 950, TokenUsage: 0.95, MaxTokens: 1000}}}
	g.flow.s.loads = loads
	for i := range 4 { // round_robin alone would send two of them to the full engine
		if r := g.post(t, "/v1/chat/completions", flowBody("q")); r.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, r.StatusCode)
		}
	}
	g.waitDone(t, 4)
	if full.requests() != 0 || free.requests() != 4 {
		t.Fatalf("the full engine got %d requests and the free one %d, want 0 and 4", full.requests(), free.requests())
	}
	settled(t, g)
}

// TestFlowDispatchesWhenPrefillDrains: a request held back only by an engine's queued prefill
// leaves the queue when the prefill is predicted to have drained below the bound, with no
// finish, report or arrival to wake the dispatcher. On a synctest bubble's clock the drain is
// armed for, and the request answered at, the predicted moment exactly.
func TestFlowDispatchesWhenPrefillDrains(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		f := newFakeWorkerOn(t, mn, "m")
		g, queued := flowGatewayOn(t, mn, FlowConfig{}, nil, f)
		g.flow.cfg.Saturation = flow.Saturation{DefaultSlots: 8, MaxPredictedWait: time.Second, Estimate: loadmon.EstimateConfig{PrefillRate: 8000}}.WithDefaults()
		loads := &settableLoads{}
		g.flow.s.loads = loads
		armed := make(chan time.Time, 16)
		g.flow.onDrain = func(at time.Time) { armed <- at }
		// 1.1 s of prefill queued at 8,000 tokens/s: past the 1 s bound for another 100 ms.
		start := time.Now()
		loads.set(loadmon.Report{PolledAt: start, Running: 1, WaitingUncachedTokens: 8800, HasUncachedTokens: true})
		g.flow.start(context.Background())
		ch := g.async(context.Background(), "/v1/chat/completions", flowBody("q"))
		waitQueued(t, queued)
		// The drain is armed for the moment the prefill is predicted below the bound: 100 ms
		// after the report, plus a millisecond.
		const want = 101 * time.Millisecond
		if at := testutil.Recv(t, armed, "the drain timer"); at.Sub(start) != want {
			t.Fatalf("drain armed %v after the report, want %v", at.Sub(start), want)
		}
		answerOK(t, ch)
		if took := time.Since(start); took != want {
			t.Errorf("the request was answered %v after the report, want %v", took, want)
		}
		g.waitDone(t, 1)
		settled(t, g)
	})
}

// TestFlowPoolCheckOnlyWithoutOwnWait: the routing cost's prompt-less prediction on the best
// engine shuts the pool only where the engines report no queued prefill of their own; engines
// that do are judged on their own predicted wait, which leaves out the cost's decode-side term.
func TestFlowPoolCheckOnlyWithoutOwnWait(t *testing.T) {
	f := newFakeWorker(t, "m")
	g, _ := flowGateway(t, FlowConfig{}, nil, f)
	g.flow.cfg.Saturation = flow.Saturation{DefaultSlots: 8, MaxPredictedWait: time.Second}.WithDefaults()
	pol, _ := g.router.For("m", worker.Regular)
	slow := fakeCoster{pol, 5} // the cost predicts 5 s on the best engine
	cands := g.reg.View().Pool("m").Regular
	loads := &settableLoads{}
	g.flow.s.loads = loads
	room := func() float64 {
		g.flow.mu.Lock()
		defer g.flow.mu.Unlock()
		r, _ := g.flow.model("m").a.Headroom(g.flow.pool(cands, slow), time.Now(), math.Inf(1))
		return r
	}
	now := time.Now()
	loads.set(loadmon.Report{PolledAt: now, Running: 1}) // request counts only
	if r := room(); r != 0 {
		t.Fatalf("room %g with no queued prefill reported, want the cost's 5 s to shut the pool", r)
	}
	loads.set(loadmon.Report{PolledAt: now.Add(time.Millisecond), Running: 1, HasUncachedTokens: true, WaitingUncachedTokens: 800})
	if r := room(); r < 1 {
		t.Fatalf("room %g with 0.1 s of prefill reported queued, want the engine's own wait to decide", r)
	}
	loads.set(loadmon.Report{PolledAt: now.Add(2 * time.Millisecond), Running: 1, HasUncachedTokens: true, WaitingUncachedTokens: 16000})
	if r := room(); r != 0 {
		t.Fatalf("room %g with 2 s of prefill reported queued, want none", r)
	}
}
