// Package proxy forwards one client request to a worker: it replays the body from memory on each
// attempt, re-selects the worker between attempts, relays the response (flushing each SSE event as
// it arrives), keeps the worker's in-flight count and circuit breaker exact, and classifies every
// failure once.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
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
}

// DefaultRetryConfig returns the defaults of DESIGN.md §3.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{MaxAttempts: 5, InitialBackoff: 50 * time.Millisecond, Multiplier: 1.5, MaxBackoff: 30 * time.Second, Jitter: 0.2}
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
}

// Observer receives forwarding events for metrics. Methods must be cheap and concurrency-safe.
type Observer interface {
	// UpstreamError records a failed attempt on w.
	UpstreamError(w *worker.Worker, kind Kind)
	// Retry records that an attempt failed with reason and another follows.
	Retry(reason string)
	// RetriesExhausted records that the last allowed attempt failed with reason.
	RetriesExhausted(reason string)
}

// NewTransport returns a transport tuned for many concurrent requests to few hosts: large idle
// pools, a short dial timeout, and no transparent decompression (bytes are relayed as sent).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
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
	cfg    Config
	client *http.Client
	obs    Observer
	rand   func() float64
}

type nopObserver struct{}

func (nopObserver) UpstreamError(*worker.Worker, Kind) {}
func (nopObserver) Retry(string)                       {}
func (nopObserver) RetriesExhausted(string)            {}

// New returns a Forwarder.
func New(cfg Config) *Forwarder {
	d := DefaultRetryConfig()
	r := &cfg.Retry
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = d.MaxAttempts
	}
	if r.InitialBackoff <= 0 {
		r.InitialBackoff = d.InitialBackoff
	}
	if r.Multiplier < 1 {
		r.Multiplier = d.Multiplier
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = d.MaxBackoff
	}
	switch {
	case r.Jitter == 0 || r.Jitter >= 1:
		r.Jitter = d.Jitter
	case r.Jitter < 0:
		r.Jitter = 0
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 600 * time.Second
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	f := &Forwarder{cfg: cfg, client: &http.Client{Transport: cfg.Transport}, obs: cfg.Observer, rand: cfg.Rand}
	if f.obs == nil {
		f.obs = nopObserver{}
	}
	if f.rand == nil {
		f.rand = rand.Float64
	}
	return f
}

// Picker chooses the worker for an attempt, given the workers already tried (in order). It
// returns nil when no worker is available.
type Picker func(tried []*worker.Worker) *worker.Worker

// Request is one client request to forward.
type Request struct {
	// Path is the upstream path with its query, e.g. "/v1/chat/completions".
	Path string
	// Header is the client's header; hop-by-hop fields are not forwarded.
	Header http.Header
	// Body is the whole request body, replayed on each attempt.
	Body []byte
	// RequestID is sent as X-Request-Id.
	RequestID string
	// ClientIP is appended to X-Forwarded-For.
	ClientIP string
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
	// Err is the classified failure, nil on a complete relay of a worker's response.
	Err error
}

// Forward sends req to workers chosen by pick and relays the answer to w. When it returns with
// Committed false, nothing was written and the caller writes the error for Err.
func (f *Forwarder) Forward(ctx context.Context, rw http.ResponseWriter, req *Request, pick Picker) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, f.cfg.RequestTimeout)
	defer cancel()
	var (
		tried []*worker.Worker
		res   Result
		skips int
	)
	for attempt := 1; ; attempt++ {
		w := pick(tried)
		if w == nil {
			if res.Err == nil || isKind(res.Err, KindConnect) {
				res.Err = noWorker(res.Err)
			}
			if res.Attempts > 0 {
				f.obs.RetriesExhausted("no_worker")
			}
			res.Status = Status(res.Err)
			return res
		}
		tried = append(tried, w)
		resp, err := f.attempt(ctx, w, req)
		if errors.Is(err, errNotAdmitted) {
			// The worker refused before anything was sent (no half-open probe slot, or
			// draining): not an attempt.
			if skips++; skips > maxSkips {
				res.Err = noWorker(res.Err)
				res.Status = Status(res.Err)
				return res
			}
			attempt--
			continue
		}
		res.Worker, res.Attempts = w, attempt
		last := attempt >= f.cfg.Retry.MaxAttempts
		if err != nil {
			res.Err, res.Status = err, Status(err)
			var e *Error
			if errors.As(err, &e) && (e.Kind == KindCanceled || e.Kind == KindShutdown) {
				return res
			}
			f.obs.UpstreamError(w, e.Kind)
			if last || ctx.Err() != nil {
				f.obs.RetriesExhausted(e.Kind.String())
				if e.Kind == KindConnect {
					// The last worker tried, after every untried one, refused the connection:
					// no worker is available (503), whatever broke on earlier attempts.
					res.Err = noWorker(res.Err)
					res.Status = Status(res.Err)
				}
				return res
			}
			f.obs.Retry(e.Kind.String())
		} else if retryableStatus(resp.StatusCode) && !last {
			resp.finish(resp.StatusCode)
			res.Err = &Error{Kind: KindStatus, Worker: w.ID, StatusCode: resp.StatusCode, Err: errors.New(http.StatusText(resp.StatusCode))}
			f.obs.UpstreamError(w, KindStatus)
			f.obs.Retry(statusReason(resp.StatusCode))
		} else {
			if retryableStatus(resp.StatusCode) && attempt > 1 {
				f.obs.RetriesExhausted(statusReason(resp.StatusCode))
			}
			res.Err = nil
			f.relay(ctx, rw, resp, start, &res)
			return res
		}
		if !f.backoff(ctx, attempt) {
			kind := KindTimeout
			if errors.Is(ctx.Err(), context.Canceled) {
				kind = canceledKind(ctx)
			}
			res.Err = &Error{Kind: kind, Worker: w.ID, Err: ctx.Err()}
			res.Status = Status(res.Err)
			return res
		}
	}
}

// maxSkips bounds how many picked workers a request may pass over because their breaker refused.
const maxSkips = 8

// errNotAdmitted says the picked worker refused the request before anything was sent: its
// breaker had no probe slot, or it started draining.
var errNotAdmitted = errors.New("the worker admits no new request")

// noWorker is the error for a request that no worker could take; last, when set, is the reason the
// last worker tried could not.
func noWorker(last error) error {
	if last == nil {
		return &Error{Kind: KindNoWorker, Err: ErrNoWorker}
	}
	return &Error{Kind: KindNoWorker, Err: fmt.Errorf("%w: no worker could be reached (last: %w)", ErrNoWorker, last)}
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
	d *= 1 + r.Jitter*(2*f.rand()-1)
	t := time.NewTimer(time.Duration(d))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// upstream is a worker response being relayed, with the bookkeeping to close exactly once.
type upstream struct {
	*http.Response
	cancel  context.CancelFunc
	release func()
	done    func(ok bool)
	abandon func()
}

// finish drains (bounded) and closes the body and settles the counters; status decides whether
// the breaker sees a failure.
func (u *upstream) finish(status int) {
	_, _ = io.CopyN(io.Discard, u.Body, 64<<10)
	_ = u.Body.Close()
	u.cancel()
	u.done(!workerFault(status))
	u.release()
}

// attempt sends one upstream request to w and returns its response with headers read.
func (f *Forwarder) attempt(ctx context.Context, w *worker.Worker, req *Request) (*upstream, error) {
	actx, cancel := context.WithCancel(ctx)
	var stopTimer func() bool
	if f.cfg.AttemptTimeout > 0 {
		t := time.AfterFunc(f.cfg.AttemptTimeout, func() { cancel() })
		stopTimer = t.Stop
	}
	u, err := http.NewRequestWithContext(actx, http.MethodPost, w.URL.String()+req.Path, bytes.NewReader(req.Body))
	if err != nil {
		cancel()
		return nil, &Error{Kind: KindTransport, Worker: w.ID, Err: err}
	}
	copyRequestHeader(u.Header, req.Header)
	u.Header.Set("X-Request-Id", req.RequestID)
	if req.ClientIP != "" {
		if prior := req.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			u.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+req.ClientIP)
		} else {
			u.Header.Set("X-Forwarded-For", req.ClientIP)
		}
	}
	f.setCredentials(u.Header, w.Spec.APIKey)
	done, abandon, admitted := w.Breaker.Begin(time.Now())
	if !admitted {
		if stopTimer != nil {
			stopTimer()
		}
		cancel()
		return nil, &Error{Kind: KindNoWorker, Worker: w.ID, Err: errNotAdmitted}
	}
	release := w.Acquire()
	if w.Draining() {
		// Removed between the pick and now. Checked after Acquire, so that a request is either
		// counted in flight when the drain starts or never sent.
		abandon()
		release()
		if stopTimer != nil {
			stopTimer()
		}
		cancel()
		return nil, &Error{Kind: KindNoWorker, Worker: w.ID, Err: errNotAdmitted}
	}
	resp, err := f.client.Do(u)
	timedOut := stopTimer != nil && !stopTimer()
	if err == nil && timedOut {
		// The attempt timer fired just as the headers arrived: the body is already cancelled.
		_ = resp.Body.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		cancel()
		release()
		kind := KindTransport
		switch {
		case ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled):
			kind = canceledKind(ctx)
		case ctx.Err() != nil || timedOut || isTimeout(err):
			kind = KindTimeout
		case isConnect(err):
			kind = KindConnect
		}
		if kind == KindCanceled || kind == KindShutdown {
			abandon()
		} else {
			done(false)
		}
		return nil, &Error{Kind: kind, Worker: w.ID, Err: err}
	}
	return &upstream{Response: resp, cancel: cancel, release: release, done: done, abandon: abandon}, nil
}

// canceledKind tells a cancelled request's two causes apart: the gateway shutting down, or the
// client leaving.
func canceledKind(ctx context.Context) Kind {
	if errors.Is(context.Cause(ctx), ErrShuttingDown) {
		return KindShutdown
	}
	return KindCanceled
}

// isKind reports whether err is a classified error of kind k.
func isKind(err error, k Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == k
}

// isConnect reports whether err is a failure to connect: nothing reached the worker.
func isConnect(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay copies the worker's response to the client, flushing each read when streaming.
func (f *Forwarder) relay(ctx context.Context, rw http.ResponseWriter, u *upstream, start time.Time, res *Result) {
	h := rw.Header()
	copyResponseHeader(h, u.Header)
	sse := strings.HasPrefix(u.Header.Get("Content-Type"), "text/event-stream")
	if sse {
		h.Del("Content-Length")
	}
	rw.WriteHeader(u.StatusCode)
	res.Status, res.Committed = u.StatusCode, true
	flusher, _ := rw.(http.Flusher)
	if sse && flusher != nil {
		flusher.Flush()
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var readErr, writeErr error
	for {
		n, err := u.Body.Read(buf)
		if n > 0 {
			if res.FirstByte == 0 {
				res.FirstByte = time.Since(start)
			}
			if _, writeErr = rw.Write(buf[:n]); writeErr != nil {
				break
			}
			if sse && flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if !sse && flusher != nil && writeErr == nil {
		flusher.Flush()
	}
	_ = u.Body.Close()
	u.cancel()
	defer u.release()
	switch {
	case writeErr == nil && ctx.Err() != nil && canceledKind(ctx) == KindShutdown:
		// The shutdown grace period is over: not the worker's fault; tell a streaming client.
		u.abandon()
		res.Err = &Error{Kind: KindShutdown, Worker: res.Worker.ID, Err: context.Cause(ctx)}
		if sse {
			writeSSEError(rw, "the gateway is shutting down; the response is incomplete", "gateway_shutting_down")
			if flusher != nil {
				flusher.Flush()
			}
		}
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled), writeErr != nil:
		// The client left: not the worker's fault.
		u.abandon()
		res.Status = 499
		res.Err = &Error{Kind: KindCanceled, Worker: res.Worker.ID, Err: errors.Join(ctx.Err(), writeErr)}
	case readErr != nil:
		u.done(false)
		kind := KindStreamBroken
		if ctx.Err() != nil {
			kind = KindTimeout
		}
		res.Err = &Error{Kind: kind, Worker: res.Worker.ID, Err: readErr}
		f.obs.UpstreamError(res.Worker, kind)
		if sse {
			writeSSEError(rw, "the worker's stream broke; the response is incomplete", "upstream_stream_broken")
			if flusher != nil {
				flusher.Flush()
			}
		}
	default:
		u.done(!workerFault(u.StatusCode))
	}
}

// writeSSEError ends a broken stream with an OpenAI-shaped error event (code is its machine
// reason) and [DONE], so a client sees a clean end instead of a hang or a truncated event.
func writeSSEError(w io.Writer, msg, code string) {
	var b bytes.Buffer
	b.WriteString("\n\ndata: {\"error\":{\"message\":")
	b.Write(quoteJSON(msg))
	b.WriteString(",\"type\":\"server_error\",\"param\":null,\"code\":")
	b.Write(quoteJSON(code))
	b.WriteString("}}\n\ndata: [DONE]\n\n")
	_, _ = w.Write(b.Bytes())
}

func quoteJSON(s string) []byte {
	var b bytes.Buffer
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(" ")
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.Bytes()
}

// Discard sends req to w once and throws the answer away, keeping w's counters and breaker
// exact. It serves the prefill half of a disaggregated request.
func (f *Forwarder) Discard(ctx context.Context, w *worker.Worker, req *Request) error {
	u, err := f.attempt(ctx, w, req)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Kind != KindCanceled {
			f.obs.UpstreamError(w, e.Kind)
		}
		return err
	}
	_, err = io.Copy(io.Discard, u.Body)
	_ = u.Body.Close()
	u.cancel()
	defer u.release()
	switch {
	case ctx.Err() != nil:
		u.abandon()
		return &Error{Kind: KindCanceled, Worker: w.ID, Err: ctx.Err()}
	case err != nil:
		u.done(false)
		f.obs.UpstreamError(w, KindStreamBroken)
		return &Error{Kind: KindStreamBroken, Worker: w.ID, Err: err}
	case u.StatusCode >= 400:
		u.done(!workerFault(u.StatusCode))
		return &Error{Kind: KindStatus, Worker: w.ID, StatusCode: u.StatusCode, Err: errors.New(http.StatusText(u.StatusCode))}
	}
	u.done(true)
	return nil
}
