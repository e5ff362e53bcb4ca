package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// upstreamFake is a worker on a loopback port that answers with a scripted handler and keeps
// every body it received.
type upstreamFake struct {
	*httptest.Server
	w *worker.Worker

	mu     sync.Mutex
	bodies []string
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstreamFake {
	t.Helper()
	u := &upstreamFake{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(u.Close)
	w, err := worker.New(worker.Spec{URL: u.URL, Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	u.w = w
	return u
}

func (u *upstreamFake) calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func status(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(code)
		io.WriteString(w, `{"ok":true}`)
	}
}

// inOrder picks the first untried available worker, like a policy over the remaining set, and
// starts over once all were tried.
func inOrder(ws ...*upstreamFake) Picker {
	return func(tried []*worker.Worker) *worker.Worker {
		for _, u := range ws {
			if !slices.Contains(tried, u.w) && u.w.Available() {
				return u.w
			}
		}
		for _, u := range ws {
			if u.w.Available() {
				return u.w
			}
		}
		return nil
	}
}

// recordingObserver keeps the retry and exhaustion reasons.
type recordingObserver struct {
	mu        sync.Mutex
	retries   []string
	exhausted []string
}

func (o *recordingObserver) UpstreamError(*worker.Worker, Kind) {}
func (o *recordingObserver) Retry(r string) {
	o.mu.Lock()
	o.retries = append(o.retries, r)
	o.mu.Unlock()
}
func (o *recordingObserver) RetriesExhausted(r string) {
	o.mu.Lock()
	o.exhausted = append(o.exhausted, r)
	o.mu.Unlock()
}

func newForwarder(obs Observer, attempts int) *Forwarder {
	return New(Config{Observer: obs, Retry: RetryConfig{MaxAttempts: attempts, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}})
}

// TestRetryOnStatus: by default only the answers that prove the engine did no work (429, 503)
// are retried; the others only when the operator lists them.
func TestRetryOnStatus(t *testing.T) {
	all := Retry5xx | RetryTimeout | Retry429 | Retry503
	cases := []struct {
		code    int
		on      RetryOn
		retried bool
		reason  string
	}{
		{429, 0, true, "status_too_many_requests"},
		{503, 0, true, "status_service_unavailable"},
		{408, 0, false, ""},
		{500, 0, false, ""},
		{502, 0, false, ""},
		{504, 0, false, ""},
		{408, all, true, "status_request_timeout"},
		{500, all, true, "status_internal_server_error"},
		{502, all, true, "status_bad_gateway"},
		{504, all, true, "status_gateway_timeout"},
		{503, Retry429, false, ""},
		{400, all, false, ""},
		{404, all, false, ""},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d on %s", tc.code, cmp.Or(tc.on, DefaultRetryOn)), func(t *testing.T) {
			a, b := newUpstream(t, status(tc.code)), newUpstream(t, status(200))
			obs := &recordingObserver{}
			rec := httptest.NewRecorder()
			body := `{"model":"m","n":1}`
			f := New(Config{Observer: obs, Retry: RetryConfig{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, On: tc.on}})
			res := f.Forward(context.Background(), rec, &Request{Path: "/v1/completions", Body: []byte(body), Header: http.Header{}}, inOrder(a, b))
			want := tc.code
			if tc.retried {
				want = 200
			}
			if rec.Code != want || res.Status != want {
				t.Fatalf("client got %d (result %d), want %d", rec.Code, res.Status, want)
			}
			if got := b.calls() == 1; got != tc.retried {
				t.Errorf("second worker called: %v, want %v", got, tc.retried)
			}
			if tc.retried && (len(obs.retries) != 1 || obs.retries[0] != tc.reason) {
				t.Errorf("retries %v, want [%s]", obs.retries, tc.reason)
			}
			if tc.retried && res.Err != nil {
				t.Errorf("a retry that succeeded left Result.Err = %v, want nil", res.Err)
			}
			if tc.retried && res.Attempts != 2 {
				t.Errorf("attempts %d, want 2", res.Attempts)
			}
			if tc.retried && b.bodies[0] != body {
				t.Errorf("replayed body %q, want %q", b.bodies[0], body)
			}
			if got := a.w.Breaker.State(time.Now()); got != worker.Closed {
				t.Errorf("one failure opened the circuit: %s", got)
			}
			if n := a.w.Inflight() + b.w.Inflight(); n != 0 {
				t.Errorf("in flight %d after the request", n)
			}
		})
	}
}

// TestRetryOnFailures: a request sent to a worker that then timed out or broke the connection
// is not re-sent unless the operator lists the outcome; a refused connection always is.
func TestRetryOnFailures(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	reset := func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}
	// Only the hanging worker needs a short attempt bound; a reset must not race one on a
	// loaded machine (a slow dial would then be a timeout, which is not retried by default).
	cases := []struct {
		name    string
		h       http.HandlerFunc
		bound   time.Duration
		on      RetryOn
		retried bool
	}{
		{"timeout by default", hang, 50 * time.Millisecond, 0, false},
		{"timeout when listed", hang, 50 * time.Millisecond, RetryTimeout, true},
		{"reset by default", reset, time.Minute, 0, false},
		{"reset when listed", reset, time.Minute, RetryReset, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newUpstream(t, tc.h), newUpstream(t, status(200))
			f := New(Config{AttemptTimeout: tc.bound, Retry: RetryConfig{MaxAttempts: 3, InitialBackoff: time.Millisecond, On: tc.on}})
			rec := httptest.NewRecorder()
			res := f.Forward(context.Background(), rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(a, b))
			if got := b.calls() == 1; got != tc.retried {
				t.Fatalf("re-sent: %v, want %v (status %d, err %v)", got, tc.retried, res.Status, res.Err)
			}
			var e *Error
			if !tc.retried && (!errors.As(res.Err, &e) || e.Attempts != 1) {
				t.Errorf("err %#v: want a classified error that counts 1 attempt", res.Err)
			}
		})
	}
}

// TestRetrySkipsTriedWorkers: with every worker failing, each is tried once before any twice,
// the attempts stop at MaxAttempts, and the last answer is relayed with exhaustion counted.
func TestRetrySkipsTriedWorkers(t *testing.T) {
	ws := []*upstreamFake{newUpstream(t, status(503)), newUpstream(t, status(503)), newUpstream(t, status(503))}
	obs := &recordingObserver{}
	rec := httptest.NewRecorder()
	res := newForwarder(obs, 5).Forward(context.Background(), rec, &Request{Path: "/v1/completions", Body: []byte(`{}`), Header: http.Header{}}, inOrder(ws...))
	if res.Attempts != 5 || rec.Code != 503 {
		t.Fatalf("attempts %d, status %d; want 5, 503", res.Attempts, rec.Code)
	}
	for i, u := range ws {
		want := 1
		if i == 0 {
			want = 3 // once all were tried, the picker starts over with its first choice
		}
		if u.calls() != want {
			t.Errorf("worker %d called %d times, want %d", i, u.calls(), want)
		}
	}
	if len(obs.retries) != 4 || len(obs.exhausted) != 1 || obs.exhausted[0] != "status_service_unavailable" {
		t.Errorf("retries %v exhausted %v", obs.retries, obs.exhausted)
	}
}

// TestConnectErrorsMeanNoWorker: a refused connection is retried elsewhere; when the last
// attempt cannot connect either, the client gets 503, not a 502 naming one worker.
func TestConnectErrorsMeanNoWorker(t *testing.T) {
	dead := newUpstream(t, status(200))
	dead.Close()
	live := newUpstream(t, status(200))
	rec := httptest.NewRecorder()
	res := newForwarder(nil, 3).Forward(context.Background(), rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(dead, live))
	if rec.Code != 200 || res.Attempts != 2 {
		t.Errorf("one dead worker: status %d after %d attempts, want 200 after 2", rec.Code, res.Attempts)
	}
	dead2 := newUpstream(t, status(200))
	dead2.Close()
	rec = httptest.NewRecorder()
	res = newForwarder(nil, 3).Forward(context.Background(), rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(dead, dead2))
	if res.Status != 503 || res.Committed || !strings.Contains(res.Err.Error(), "connection refused") {
		t.Errorf("all dead: status %d committed %v err %v; want an uncommitted 503 naming the cause", res.Status, res.Committed, res.Err)
	}
}

// TestNoRetryAfterFirstByte: a stream that breaks after its first event is not retried; the
// client gets an SSE error event and [DONE].
func TestNoRetryAfterFirstByte(t *testing.T) {
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	b := newUpstream(t, status(200))
	rec := httptest.NewRecorder()
	res := newForwarder(nil, 5).Forward(context.Background(), rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(a, b))
	if b.calls() != 0 || res.Attempts != 1 || !res.Committed {
		t.Fatalf("retried after bytes reached the client: attempts %d, second worker %d calls", res.Attempts, b.calls())
	}
	out := rec.Body.String()
	if !strings.HasPrefix(out, "data: {\"n\":1}\n\n") || !strings.Contains(out, `"code":"upstream_stream_broken"`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Errorf("client stream %q", out)
	}
	if a.w.Inflight() != 0 {
		t.Errorf("in flight %d", a.w.Inflight())
	}
}

// TestRetryBoundedByTotalTime: attempts stop when the request timeout ends, long before
// MaxAttempts.
func TestRetryBoundedByTotalTime(t *testing.T) {
	a := newUpstream(t, status(503))
	f := New(Config{RequestTimeout: 300 * time.Millisecond, Retry: RetryConfig{MaxAttempts: 100, InitialBackoff: 100 * time.Millisecond, Multiplier: 1.01}})
	start := time.Now()
	res := f.Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(a))
	// Unbounded by time, 100 attempts 100 ms apart would take 10 s: fewer than ten attempts
	// show the bound stopped them, on a machine of any speed (a slow one makes fewer).
	if res.Attempts >= 10 {
		t.Errorf("%d attempts in %v; want the 300 ms bound to stop them", res.Attempts, time.Since(start))
	}
	if res.Status != 504 {
		t.Errorf("status %d, want 504 once the time is up", res.Status)
	}
}

// TestBackoffSchedule checks the waits in virtual time: 50 ms ×1.5 per attempt, capped, with the
// jitter's extremes at ±20 %.
func TestBackoffSchedule(t *testing.T) {
	cases := []struct {
		attempt int
		rand    float64
		want    time.Duration
	}{
		{1, 0.5, 50 * time.Millisecond},
		{2, 0.5, 75 * time.Millisecond},
		{3, 0.5, 112500 * time.Microsecond},
		{1, 0, 40 * time.Millisecond},
		{1, 1, 60 * time.Millisecond},
		{40, 0.5, 30 * time.Second},
	}
	for _, tc := range cases {
		t.Run("", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := New(Config{Rand: func() float64 { return tc.rand }})
				start := time.Now()
				if !f.backoff(context.Background(), tc.attempt) {
					t.Fatal("backoff gave up")
				}
				if d := time.Since(start); d != tc.want {
					t.Errorf("attempt %d rand %v: waited %v, want %v", tc.attempt, tc.rand, d, tc.want)
				}
			})
		})
	}
}

// TestClientCancelStopsRetries: a client that leaves during the backoff ends the request at once
// with no further attempt, and it is never the worker's failure.
func TestClientCancelStopsRetries(t *testing.T) {
	a := newUpstream(t, status(503))
	ctx, cancel := context.WithCancel(context.Background())
	f := New(Config{Retry: RetryConfig{MaxAttempts: 5, InitialBackoff: time.Hour}})
	go func() {
		for a.calls() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	res := f.Forward(ctx, httptest.NewRecorder(), &Request{Path: "/x", Body: bytes.Repeat([]byte("x"), 10), Header: http.Header{}}, inOrder(a))
	if res.Status != 499 || a.calls() != 1 {
		t.Errorf("status %d after %d calls, want 499 after 1", res.Status, a.calls())
	}
}

// TestDrainBetweenPickAndSend: a worker removed after the pick but before the send gets
// nothing; the request goes elsewhere without spending an attempt.
func TestDrainBetweenPickAndSend(t *testing.T) {
	a, b := newUpstream(t, status(200)), newUpstream(t, status(200))
	next := inOrder(a, b)
	pick := func(tried []*worker.Worker) *worker.Worker {
		w := next(tried)
		if w == a.w {
			a.w.Drain() // DELETE /workers/{id} lands right now
		}
		return w
	}
	rec := httptest.NewRecorder()
	res := newForwarder(nil, 1).Forward(context.Background(), rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, pick)
	if rec.Code != 200 || res.Worker != b.w || a.calls() != 0 || res.Attempts != 1 {
		t.Errorf("status %d, worker a called %d times, attempts %d; want 200 from b, 0, 1", rec.Code, a.calls(), res.Attempts)
	}
	if a.w.Inflight() != 0 {
		t.Errorf("drained worker in flight %d", a.w.Inflight())
	}
}

// TestShutdownCause: requests ended with ErrShuttingDown as the cause get a clear error — a 503
// before the status line, an SSE error event after it — are not retried, and never count against
// the worker.
func TestShutdownCause(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "before headers", true: "mid-stream"}[stream], func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: {\"n\":1}\n\n")
					w.(http.Flusher).Flush()
				}
				arrived <- struct{}{}
				<-r.Context().Done()
			})
			b := newUpstream(t, status(200))
			ctx, end := context.WithCancelCause(context.Background())
			rec := &signallingRecorder{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{})}
			go func() {
				<-arrived
				if stream {
					<-rec.wrote // the first event reached the client
				}
				end(ErrShuttingDown)
			}()
			f := New(Config{Retry: RetryConfig{MaxAttempts: 5}})
			res := f.Forward(ctx, rec, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(a, b))
			if !isKind(res.Err, KindShutdown) || b.calls() != 0 {
				t.Fatalf("err %v, second worker %d calls; want a shutdown error and no retry", res.Err, b.calls())
			}
			if !stream && (res.Status != 503 || res.Committed) {
				t.Errorf("status %d committed %v; want an uncommitted 503", res.Status, res.Committed)
			}
			if stream && !strings.Contains(rec.Body.String(), `"code":"gateway_shutting_down"`) {
				t.Errorf("stream ended %q", rec.Body.String())
			}
			if a.w.Inflight() != 0 {
				t.Errorf("in flight %d", a.w.Inflight())
			}
			for i := 0; i < 9; i++ { // one more failure than the default threshold of 10 needs
				done, _, _ := a.w.Breaker.Begin(time.Now())
				done(false)
			}
			if a.w.Breaker.State(time.Now()) != worker.Closed {
				t.Error("the shutdown counted as the worker's failure")
			}
		})
	}
}

// signallingRecorder closes wrote on the first body write.
type signallingRecorder struct {
	*httptest.ResponseRecorder
	wrote chan struct{}
	once  sync.Once
}

func (r *signallingRecorder) Write(b []byte) (int, error) {
	n, err := r.ResponseRecorder.Write(b)
	r.once.Do(func() { close(r.wrote) })
	return n, err
}

// isKind reports whether err is a classified error of kind k.
func isKind(err error, k Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == k
}

// TestAwaitingFirstByte: a streamed request counts in the worker's Awaiting from its send until
// the first byte of the answer's body reaches the gateway (the engine finished its prefill), and
// in Inflight until its end; both are zero afterwards, and after an answer with no body at all.
// A request that is not streamed counts only in Inflight.
func TestAwaitingFirstByte(t *testing.T) {
	prefilled, sent, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // headers alone are not a token
		<-prefilled
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		close(sent)
		<-done
		io.WriteString(w, "data: [DONE]\n\n")
	})
	// A failure below must not leave the handler held: the server's Close waits for it.
	prefill, finish := sync.OnceFunc(func() { close(prefilled) }), sync.OnceFunc(func() { close(done) })
	t.Cleanup(func() { prefill(); finish() })
	rw := newSignalWriter()
	fin := make(chan Result, 1)
	go func() {
		fin <- newForwarder(nil, 1).Forward(context.Background(), rw, &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}, Stream: true}, inOrder(a))
	}()
	testutil.Recv(t, rw.header, "the worker's headers") // its first token is still to come
	if a.w.Awaiting() != 1 || a.w.Inflight() != 1 {
		t.Fatalf("before the first byte: awaiting %d, in flight %d; want 1 and 1", a.w.Awaiting(), a.w.Inflight())
	}
	prefill()
	testutil.Recv(t, sent, "the worker's first event")
	testutil.Recv(t, rw.body, "the first event relayed")
	if a.w.Awaiting() != 0 || a.w.Inflight() != 1 {
		t.Fatalf("after the first byte: awaiting %d, in flight %d; want 0 and 1", a.w.Awaiting(), a.w.Inflight())
	}
	finish()
	if res := testutil.Recv(t, fin, "the forward's end"); res.Err != nil {
		t.Fatal(res.Err)
	}
	if a.w.Awaiting() != 0 || a.w.Inflight() != 0 {
		t.Fatalf("after the end: awaiting %d, in flight %d", a.w.Awaiting(), a.w.Inflight())
	}

	empty := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	newForwarder(nil, 1).Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}, Stream: true}, inOrder(empty))
	if empty.w.Awaiting() != 0 || empty.w.Inflight() != 0 {
		t.Fatalf("after a bodiless answer: awaiting %d, in flight %d", empty.w.Awaiting(), empty.w.Inflight())
	}

	// A request that is not streamed never counts: its first byte comes with its end.
	arrived, release := make(chan struct{}), make(chan struct{})
	whole := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, `{"ok":true}`)
	})
	answer := sync.OnceFunc(func() { close(release) })
	t.Cleanup(answer)
	go func() {
		fin <- newForwarder(nil, 1).Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(whole))
	}()
	testutil.Recv(t, arrived, "the whole answer's request at the worker")
	if whole.w.Awaiting() != 0 || whole.w.Inflight() != 1 {
		t.Fatalf("a whole answer in flight: awaiting %d, in flight %d; want 0 and 1", whole.w.Awaiting(), whole.w.Inflight())
	}
	answer()
	testutil.Recv(t, fin, "the whole answer's forward")
}

// signalWriter is a ResponseWriter that signals its header and its first body write.
type signalWriter struct {
	*httptest.ResponseRecorder
	header, body chan struct{}
	once         [2]sync.Once
}

func newSignalWriter() *signalWriter {
	return &signalWriter{ResponseRecorder: httptest.NewRecorder(), header: make(chan struct{}), body: make(chan struct{})}
}

func (s *signalWriter) Flush() {
	s.ResponseRecorder.Flush()
	s.once[0].Do(func() { close(s.header) })
}

func (s *signalWriter) Write(b []byte) (int, error) {
	n, err := s.ResponseRecorder.Write(b)
	s.once[1].Do(func() { close(s.body) })
	return n, err
}
