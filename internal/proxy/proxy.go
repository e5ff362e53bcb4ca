// Package proxy forwards one client request to a worker: it replays the body from memory on each
// attempt, re-selects the worker between attempts, relays the response (flushing each SSE event as
// it arrives), keeps the worker's in-flight count and circuit breaker exact, and classifies every
// failure once.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// RetryConfig bounds retries. Zero fields take DefaultRetryConfig's values.
type RetryConfig struct {
	// MaxAttempts is the number of attempts in all, the first included. Default 5; 1 disables.
	MaxAttempts int `yaml:"max_attempts"`
	// InitialBackoff is the wait before the second attempt. Default 50ms.
	InitialBackoff time.Duration `yaml:"initial_backoff"`
	// Multiplier grows the backoff each attempt. Default 1.5.
	Multiplier float64 `yaml:"multiplier"`
	// MaxBackoff caps one wait. Default 30s.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// Jitter is the ± fraction applied to each wait, below 1. Default 0.2; negative means none.
	Jitter float64 `yaml:"jitter"`
	// On is the set of failed outcomes that are retried. Zero means DefaultRetryOn: only those
	// where the engine cannot have started work (connect errors, 429 and 503 answers).
	On RetryOn `yaml:"on"`
}

// DefaultRetryConfig returns the defaults of the reference gateway: 5 attempts, backoff 50 ms
// ×1.5 up to 30 s, ±20 % jitter.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{MaxAttempts: 5, InitialBackoff: 50 * time.Millisecond, Multiplier: 1.5, MaxBackoff: 30 * time.Second, Jitter: 0.2, On: DefaultRetryOn}
}

// Config configures a Forwarder.
type Config struct {
	// RequestTimeout bounds a request in all, retries included. Default 600s.
	RequestTimeout time.Duration
	// AttemptTimeout bounds one attempt up to the response headers; 0 means only RequestTimeout.
	// Set it to let a hung worker's requests move elsewhere.
	AttemptTimeout time.Duration
	// Retry bounds retries.
	Retry RetryConfig
	// Transport sends upstream requests; nil means NewTransport().
	Transport http.RoundTripper
	// Observer is told of errors and retries; nil means none.
	Observer Observer
	// Rand returns a float in [0,1) for jitter; nil means math/rand/v2.
	Rand func() float64
	// ForwardClientAuth sends the client's Authorization header on to the worker. Off by
	// default: that header holds this gateway's key, which no worker should learn.
	ForwardClientAuth bool
	// HopID, when set, is appended to HopHeader on every upstream request.
	HopID string
	// StreamIdleTimeout ends a streamed answer on which the worker has sent no complete data
	// event for this long, counted from its response headers, with an SSE error event
	// (--stream-idle-timeout; DefaultStreamIdleTimeout there). Comments (": ping"), events
	// without a data line and the bytes of an event not yet ended do not restart it: a worker
	// cannot hold a stream open with them. An event not yet ended is also bounded in bytes
	// (maxEventBytes held back, then passed through). Zero or negative means no such bound:
	// only RequestTimeout ends a silent stream.
	StreamIdleTimeout time.Duration
	// ConnReuse reports whether a connection to worker w may carry more than one request
	// (--worker-conn-reuse, and the worker's conn_reuse label). nil means always. A worker that
	// echoes no request id cannot have its answers bound to their requests (bind.go): a
	// connection of its own per request is the one way to keep a stray answer from reaching
	// another client.
	ConnReuse func(w *worker.Worker) bool
	// Logger receives what a client is not shown: the text of a worker's 5xx answer (cut to
	// maxLoggedBody bytes). nil means slog.Default().
	Logger *slog.Logger
}

// DefaultStreamIdleTimeout is the gateway's default Config.StreamIdleTimeout: far above any
// pause between an engine's tokens, yet a hung engine's streams end within a minute.
const DefaultStreamIdleTimeout = 60 * time.Second

// Observer receives forwarding events for metrics. Methods must be cheap and concurrency-safe.
type Observer interface {
	// UpstreamError records a failed attempt on w.
	UpstreamError(w *worker.Worker, kind Kind)
	// Retry records that an attempt failed with reason and another follows.
	Retry(reason string)
	// RetriesExhausted records that the last allowed attempt failed with reason.
	RetriesExhausted(reason string)
}

// workerDialer opens connections to workers.
var workerDialer = &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}

// NewTransport returns a transport tuned for many concurrent requests to few hosts: large idle
// pools, a short dial timeout, and no transparent decompression (bytes are relayed as sent).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dialBodyConn(workerDialer.DialContext),
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// A worker's headers are a few hundred bytes; more than this is a broken or hostile
		// worker, and the attempt fails instead of the gateway buffering it.
		MaxResponseHeaderBytes: 64 << 10,
		WriteBufferSize:        32 << 10,
		ReadBufferSize:         32 << 10,
	}
}

// Forwarder sends requests to workers. Safe for concurrent use.
type Forwarder struct {
	cfg Config
	// transport is called directly, not through an http.Client: a proxy relays a worker's
	// redirect rather than following it (as httputil.ReverseProxy does), and a client's
	// per-request header copy (kept for redirects) would be work for nothing.
	transport http.RoundTripper
	obs       Observer
	// deadlines bounds each request by RequestTimeout.
	deadlines *deadlines
	// hop is the HopHeader value of a request that crossed no other gateway.
	hop  []string
	rand func() float64
	// fresh is transport's twin that dials a new connection for every request: for a resend
	// after a stray, and for workers whose connections are not reused (Config.ConnReuse).
	fresh http.RoundTripper
}

type nopObserver struct{}

func (nopObserver) UpstreamError(*worker.Worker, Kind) {}
func (nopObserver) Retry(string)                       {}
func (nopObserver) RetriesExhausted(string)            {}

// New returns a Forwarder.
func New(cfg Config) *Forwarder {
	d := DefaultRetryConfig()
	r := &cfg.Retry
	r.MaxAttempts = cmp.Or(max(r.MaxAttempts, 0), d.MaxAttempts)
	r.InitialBackoff = cmp.Or(max(r.InitialBackoff, 0), d.InitialBackoff)
	r.MaxBackoff = cmp.Or(max(r.MaxBackoff, 0), d.MaxBackoff)
	r.On = cmp.Or(r.On, d.On)
	if r.Multiplier < 1 {
		r.Multiplier = d.Multiplier
	}
	switch {
	case r.Jitter == 0 || r.Jitter >= 1:
		r.Jitter = d.Jitter
	case r.Jitter < 0:
		r.Jitter = 0
	}
	cfg.RequestTimeout = cmp.Or(max(cfg.RequestTimeout, 0), 600*time.Second)
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Forwarder{
		cfg:       cfg,
		deadlines: &deadlines{d: cfg.RequestTimeout},
		transport: cfg.Transport,
		fresh:     freshTransport(cfg.Transport),
		hop:       []string{cfg.HopID},
		obs:       cmp.Or[Observer](cfg.Observer, nopObserver{}),
		rand:      cfg.Rand,
	}
}

// Picker chooses the worker for an attempt, given the workers already tried (in order). It
// returns nil when no worker is available.
type Picker func(tried []*worker.Worker) *worker.Worker

// Request is one client request to forward.
type Request struct {
	// Method is the upstream request's method; "" is POST, every inference route's.
	Method string
	// Path is the upstream path with the client's query, e.g. "/v1/chat/completions?x=1".
	Path string
	// Header is the client's header; hop-by-hop fields are not forwarded.
	Header http.Header
	// Body is the whole request body, replayed on each attempt.
	Body []byte
	// BodyRef, when set, is held for as long as net/http may read Body (see BodyRef).
	BodyRef BodyRef
	// RequestID is sent as X-Request-Id.
	RequestID string
	// ClientIP is appended to X-Forwarded-For.
	ClientIP string
	// Stream is true when the client asked for a streamed answer: it is flushed per chunk and cut
	// only between events, whatever content type the worker labels it with.
	Stream bool
}

// Result says how a forwarded request ended.
type Result struct {
	// Worker served the last attempt (nil if none was picked).
	Worker *worker.Worker
	// Status is what the client saw (or 499 when it left).
	Status int
	// Attempts is how many attempts were made.
	Attempts int
	// FirstByte is the time from the start until the first body byte reached the client.
	FirstByte time.Duration
	// Committed is true once a status line was sent to the client; after that the gateway must
	// not write an error response.
	Committed bool
	// Abort is true when the client got a truncated body that nothing marks as such (a
	// non-streamed answer that broke mid-body): once its books are settled, the handler must
	// abort the connection (panic with http.ErrAbortHandler) so the client sees an error, as
	// httputil.ReverseProxy does, instead of a clean end.
	Abort bool
	// Err is the classified failure (a *Error), nil on a complete relay of a worker's response.
	Err error
}

// Forward sends req to workers chosen by pick and relays the answer to w. When it returns with
// Committed false, nothing was written and the caller writes the error for Err.
func (f *Forwarder) Forward(ctx context.Context, rw http.ResponseWriter, req *Request, pick Picker) Result {
	start := time.Now()
	bounded := f.deadlines.bound(ctx)
	defer f.deadlines.release(bounded)
	ctx = bounded
	var (
		tried []*worker.Worker
		res   Result
		last  *Error // the last failed attempt
		skips int
	)
	for attempt := 1; ; {
		w := pick(tried)
		if w == nil {
			if res.Attempts > 0 {
				f.obs.RetriesExhausted("no_worker")
			}
			return f.fail(&res, noWorker(last, res.Attempts))
		}
		final := attempt >= f.cfg.Retry.MaxAttempts
		e, admitted := f.try(ctx, rw, req, w, attempt, final, start, &res)
		if !admitted {
			// The worker refused before anything was sent (no half-open probe slot, or
			// draining): not an attempt.
			if skips++; skips > maxSkips {
				return f.fail(&res, noWorker(last, res.Attempts))
			}
			// Only a next pick reads tried: a request served at its first pick allocates none.
			tried = append(tried, w)
			continue
		}
		res.Worker, res.Attempts = w, attempt
		if e == nil {
			// An earlier attempt's failure is history (Attempts counts it): the request
			// succeeded, and the caller's accounting must see it so.
			res.Err = nil
			return res
		}
		e.Attempts = attempt
		if last != nil && e.LastStatus == 0 {
			e.LastStatus = last.LastStatus
		}
		f.fail(&res, e)
		if res.Committed || e.Kind == KindCanceled || e.Kind == KindShutdown {
			return res
		}
		last = e
		if cerr := ctx.Err(); cerr != nil && !final && f.retries(e) {
			// The client left (or the request's time ran out) while this attempt failed: the
			// request ends for that reason, not with an answer nobody is waiting for.
			f.obs.RetriesExhausted(e.reason())
			kind, _ := classify(ctx, cerr, false, false)
			return f.fail(&res, &Error{Kind: kind, Worker: w.ID, Attempts: attempt, LastStatus: e.LastStatus, Err: cerr})
		}
		if final || !f.retries(e) {
			if final {
				f.obs.RetriesExhausted(e.reason())
			}
			if e.Kind == KindConnect {
				// The last worker tried, after every untried one, refused the connection: no
				// worker is available (503), whatever broke on earlier attempts.
				f.fail(&res, noWorker(e, attempt))
			}
			return res
		}
		f.obs.Retry(e.reason())
		if !f.backoff(ctx, attempt) {
			kind, _ := classify(ctx, ctx.Err(), false, false)
			return f.fail(&res, &Error{Kind: kind, Worker: w.ID, Attempts: attempt, LastStatus: e.LastStatus, Err: ctx.Err()})
		}
		tried = append(tried, w)
		attempt++
	}
}

// fail records e as the request's failure.
func (f *Forwarder) fail(res *Result, e *Error) Result {
	res.Err = e
	if !res.Committed {
		res.Status = Status(e)
	}
	return *res
}

// retries reports whether a failed attempt is retried, by the configured RetryOn.
func (f *Forwarder) retries(e *Error) bool {
	if e.Kind == KindStatus {
		return f.cfg.Retry.On.status(e.StatusCode)
	}
	return f.cfg.Retry.On.failure(e.Kind)
}

// reason is the metric label of a failed attempt.
func (e *Error) reason() string {
	if e.Kind == KindStatus {
		return statusReason(e.StatusCode)
	}
	return e.Kind.String()
}

// maxSkips bounds how many picked workers a request may pass over because their breaker refused.
const maxSkips = 8

// errNotAdmitted says the picked worker refused the request before anything was sent: its
// breaker had no probe slot, or it started draining.
var errNotAdmitted = errors.New("the worker admits no new request")

// noWorker is the error for a request that no worker could take; last, when set, is the failure
// of the last attempt made.
func noWorker(last *Error, attempts int) *Error {
	e := &Error{Kind: KindNoWorker, Err: ErrNoWorker, Attempts: attempts, Last: last}
	if last != nil {
		e.LastStatus = last.LastStatus
		e.Err = fmt.Errorf("%w: no worker could be reached (last: %w)", ErrNoWorker, last)
	}
	return e
}

func statusReason(code int) string {
	return "status_" + strings.ToLower(strings.ReplaceAll(http.StatusText(code), " ", "_"))
}

// backoff waits before attempt+1; false if the context ended first.
func (f *Forwarder) backoff(ctx context.Context, attempt int) bool {
	r := f.cfg.Retry
	d := float64(r.InitialBackoff)
	for i := 1; i < attempt; i++ {
		d *= r.Multiplier
	}
	d = min(d, float64(r.MaxBackoff))
	d *= 1 + r.Jitter*(2*f.cfg.Rand()-1)
	t := time.NewTimer(time.Duration(d))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// attempt is one upstream request to one worker, from its admission to its settlement. Its end
// method is the one place where the attempt's books are settled: body, context, timer, the
// worker's lease (in-flight count and breaker) and the error metric.
type attempt struct {
	f     *Forwarder
	w     *worker.Worker
	lease worker.Lease
	// ctx and cancel are the attempt's own context: the request's, ended also by timer up to
	// its response headers (Config.AttemptTimeout; nil without one), a streamed answer's idle
	// bound (Config.StreamIdleTimeout, cause errStreamIdle), or the worker failing its health
	// checks before the headers came (cause errWorkerDown; stopDown ends that watch).
	ctx      context.Context
	cancel   context.CancelCauseFunc
	timer    *time.Timer
	stopDown func() bool
	resp     *http.Response
	// id is the attempt's own request id (X-Request-Id), which binds the answer to it.
	id string
	// conn is the connection the request went out on; rt the transport that sends it.
	conn *connRef
	rt   http.RoundTripper
	// drain asks end to read what is left of a short body so the connection is reused.
	drain bool
	// outcome is what the worker's books record; kind, when failed, is the failure.
	outcome worker.Outcome
	kind    Kind
	failed  bool
}

// begin admits an attempt on w into a (the caller's, so that it lives on the caller's stack)
// and builds its upstream request; ok is false when w refused it (nothing was sent and nothing
// needs settling).
func (f *Forwarder) begin(ctx context.Context, w *worker.Worker, req *Request, a *attempt) (u *http.Request, ok bool) {
	lease, ok := w.Begin(time.Now())
	if !ok {
		return nil, false
	}
	*a = attempt{f: f, w: w, lease: lease}
	if !req.Stream {
		// A whole answer's first byte comes at its end: it says nothing of the prefill, so the
		// attempt does not count in Worker.Awaiting.
		a.lease.FirstByte()
	}
	// The attempt's own context ends with the request, at its attempt timeout, at its stream's
	// idle bound, and when the worker fails its health checks before the answer's headers came
	// (errWorkerDown: a frozen or dead engine, whose attempt goes elsewhere; frozen.go).
	actx, cancel := context.WithCancelCause(ctx)
	a.cancel = cancel
	if d := f.cfg.AttemptTimeout; d > 0 {
		a.timer = time.AfterFunc(d, func() { cancel(nil) })
	}
	a.stopDown = context.AfterFunc(w.Alive(), func() { cancel(errWorkerDown) })
	a.ctx = actx
	a.id, a.conn, a.rt = newAttemptID(), newConnRef(), f.transport
	reuse := f.cfg.ConnReuse == nil || f.cfg.ConnReuse(w)
	if !reuse {
		a.rt = f.fresh
	}
	u, err := newUpstreamRequest(httptrace.WithClientTrace(actx, &a.conn.trace), w.URL, req.Path, len(req.Header)+upstreamHeaders)
	if err != nil {
		// Only a malformed path can fail here; it is a gateway bug, not the worker's.
		a.setFailure(KindTransport, worker.Abandoned)
		a.end()
		return nil, false
	}
	if req.Method != "" {
		u.Method = req.Method
	}
	u.Close = !reuse
	copyRequestHeader(u.Header, req.Header)
	// A pooled connection the worker had already closed fails a request that never reached it.
	// Marked idempotent (a nil value is not sent), net/http's Transport sends such a request
	// again on a new connection when a reused one fails before any byte of an answer.
	if _, ok := u.Header["X-Idempotency-Key"]; !ok {
		u.Header["X-Idempotency-Key"] = nil
	}
	// The attempt's id and X-Forwarded-For share one backing array, each a full slice of its
	// own (net/http only reads an outgoing request's header). The client's id is not sent: the
	// worker's answer is bound by the gateway's (bind.go).
	vals := []string{a.id, req.ClientIP}
	u.Header["X-Request-Id"] = vals[0:1:1]
	if req.ClientIP != "" {
		if prior := req.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			vals[1] = strings.Join(prior, ", ") + ", " + req.ClientIP
		}
		u.Header["X-Forwarded-For"] = vals[1:2:2]
	}
	f.setCredentials(u, w.Spec.APIKey)
	// Last: every caller sends u, and the transport closes (so releases) its body. net/http
	// writes a small body with the header in one write only from a copy of its own
	// (setSmallBody).
	if len(req.Body) <= smallBody {
		setSmallBody(u, req.Body)
	} else {
		setBody(u, req)
	}
	return u, true
}

// send sends u and waits for the response headers; the attempt's timer covers only this part.
func (a *attempt) send(ctx context.Context, u *http.Request) *Error {
	resp, err := a.rt.RoundTrip(u)
	if err != nil && garbled(err) && ctx.Err() == nil && u.GetBody != nil {
		// What came back does not parse as an answer: bytes a worker left on a pooled
		// connection after an earlier answer (a body longer than its Content-Length, a late
		// stray write), read as this request's. net/http has closed that connection; the
		// request goes once more, on another, rather than fail for another request's bytes.
		if body, gerr := u.GetBody(); gerr == nil {
			again := *u
			again.Body = body
			resp, err = a.rt.RoundTrip(&again)
		}
	}
	timedOut := a.timer != nil && !a.timer.Stop()
	a.timer = nil // a resend after a stray (bind.go) has only the request's bound
	if err != nil && a.workerDown(ctx) {
		// The worker failed its health checks while this attempt waited for its headers.
		a.setFailure(KindConnect, worker.Failed)
		return &Error{Kind: KindConnect, Worker: a.w.ID, Err: fmt.Errorf("%w: %w", errWorkerDown, err)}
	}
	if err != nil && !timedOut && ctx.Err() == nil && a.refusedAfterReset(err) {
		// The engine reset the connection before any answer and now refuses new ones: it is
		// gone, and did no work a retry would duplicate.
		a.setFailure(KindConnect, worker.Failed)
		return &Error{Kind: KindConnect, Worker: a.w.ID, Err: fmt.Errorf("%w: %w", errEngineGone, err)}
	}
	if err == nil && a.stopDown != nil {
		// Headers came: a health failure from now on is the stream's (its idle bound), not a
		// reason to send the request elsewhere.
		a.stopDown()
	}
	if err == nil && timedOut {
		// The attempt timer fired just as the headers arrived: the body is already cancelled.
		_ = resp.Body.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		kind, outcome := classify(ctx, err, timedOut, false)
		a.setFailure(kind, outcome)
		return &Error{Kind: kind, Worker: a.w.ID, Err: err}
	}
	a.resp = resp
	return nil
}

func (a *attempt) setFailure(k Kind, o worker.Outcome) {
	a.kind, a.outcome, a.failed = k, o, true
}

// end settles the attempt: it runs once, deferred right after admission.
func (a *attempt) end() {
	if a.resp != nil {
		if a.drain {
			_, _ = io.CopyN(io.Discard, a.resp.Body, 64<<10)
		}
		_ = a.resp.Body.Close()
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopDown != nil {
		a.stopDown()
	}
	if a.cancel != nil {
		a.cancel(nil)
	}
	a.lease.End(a.outcome)
	if a.failed && (a.outcome == worker.Failed || a.kind == KindStatus) {
		a.f.obs.UpstreamError(a.w, a.kind)
	}
}

// try runs one attempt on w: it sends the request and either relays the answer to the client
// (nil error) or returns why it failed. admitted is false when w refused before anything was
// sent.
func (f *Forwarder) try(ctx context.Context, rw http.ResponseWriter, req *Request, w *worker.Worker, n int, final bool, start time.Time, res *Result) (e *Error, admitted bool) {
	var a attempt
	u, ok := f.begin(ctx, w, req, &a)
	if !ok {
		return nil, false
	}
	defer a.end()
	if e := a.sendBound(ctx, req, u); e != nil {
		return e, true
	}
	code := a.resp.StatusCode
	if f.cfg.Retry.On.status(code) {
		if !final {
			a.drain = true
			a.outcome = statusOutcome(code)
			a.setFailure(KindStatus, a.outcome)
			return &Error{Kind: KindStatus, Worker: w.ID, StatusCode: code, LastStatus: code, Err: errors.New(http.StatusText(code))}, true
		}
		if n > 1 {
			f.obs.RetriesExhausted(statusReason(code))
		}
	}
	if code >= 500 {
		return a.replaceServerError(rw, req, res), true
	}
	return a.relay(ctx, rw, req, start, res), true
}

// Discard sends req to w once and throws the answer away, keeping w's counters and breaker
// exact. It serves the prefill half of a disaggregated request, under the same time bounds as
// Forward: RequestTimeout in all, AttemptTimeout up to the response headers.
func (f *Forwarder) Discard(ctx context.Context, w *worker.Worker, req *Request) error {
	bounded := f.deadlines.bound(ctx)
	defer f.deadlines.release(bounded)
	ctx = bounded
	var a attempt
	u, ok := f.begin(ctx, w, req, &a)
	if !ok {
		return noWorker(nil, 0)
	}
	defer a.end()
	if e := a.sendBound(ctx, req, u); e != nil {
		e.Attempts = 1
		return e
	}
	code := a.resp.StatusCode
	if _, err := io.Copy(io.Discard, a.resp.Body); err != nil {
		kind, outcome := classify(ctx, err, false, true)
		if kind == KindStreamBroken || kind == KindTimeout {
			// Nothing reached a client: a prefill cut short is the worker's failure.
			outcome = worker.Failed
		}
		a.setFailure(kind, outcome)
		return &Error{Kind: kind, Worker: w.ID, Attempts: 1, LastStatus: code, Err: err}
	}
	a.outcome = statusOutcome(code)
	if code >= 400 {
		a.setFailure(KindStatus, a.outcome)
		return &Error{Kind: KindStatus, Worker: w.ID, StatusCode: code, Attempts: 1, LastStatus: code, Err: errors.New(http.StatusText(code))}
	}
	return nil
}
