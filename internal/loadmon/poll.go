package loadmon

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// ErrBodyTooLarge is returned for a response body larger than Config.MaxBody.
var ErrBodyTooLarge = errors.New("response body too large")

// ErrEncoding is returned for a response body in a content encoding other than gzip.
var ErrEncoding = errors.New("unsupported content encoding")

// StatusError is a poll answered with a status other than 200.
type StatusError struct {
	// Code is the HTTP status code.
	Code int
}

// Error implements error.
func (e *StatusError) Error() string { return fmt.Sprintf("status %d", e.Code) }

// probeRetry is how many intervals pass before a failed /v1/models runtime probe is retried.
const probeRetry = 10

// keepBuf is the largest read buffer a poll goroutine keeps between polls; a larger one (a worker
// with a huge /metrics) is dropped so that it does not pin memory.
const keepBuf = 1 << 20

// pollState is what the monitor remembers about one worker between rounds. It is touched only by
// the round that polls the worker (rounds are serialized), so it needs no lock.
type pollState struct {
	w     *worker.Worker
	round uint64 // last round that saw the worker in the registry

	// Requests built once per worker; each poll sends a copy bound to its context.
	reqs [nReqKinds]*http.Request

	source      Source    // the source that answered last, tried first
	probed      bool      // /v1/models answered: the runtime is learned or not one we know
	probeAfter  time.Time // no /v1/models probe before this time
	failures    int       // consecutive failed polls
	lastSuccess time.Time // PolledAt of the last successful poll

	// The last GenTokensTotal seen and its PolledAt, for deriveThroughput.
	genTotal int64
	genAt    time.Time
	// The last prefill counters seen, for derivePrefillRate (prefillrate.go).
	prefill PrefillCounters
}

// sources is the one place where a load source is defined: the path it is polled on and how its
// body becomes a Report (runtime tells the Prometheus parser which names to read). Adding a
// source is a Source constant, a row here, and its place in sourceOrder.
var sources = [nSources]struct {
	path  string
	parse func(body []byte, runtime string) (Report, error)
}{
	SourceLoads:   {"/v1/loads?include=core", func(b []byte, _ string) (Report, error) { return ParseLoads(b) }},
	SourceMetrics: {"/metrics", ParsePrometheus},
}

// nSources bounds the Source values that have a row in sources.
const nSources = SourceMetrics + 1

// reqKind names the requests a poll sends: one per load source (its Source value), and the
// /v1/models runtime probe.
type reqKind uint8

const (
	reqModels = reqKind(nSources)
	nReqKinds = reqModels + 1
)

// path returns the request's path and query.
func (k reqKind) path() string {
	if k == reqModels {
		return "/v1/models"
	}
	return sources[k].path
}

// newPollState prepares w's requests. A key that is not a valid header value is set as it is:
// net/http refuses to send it, so the worker's polls fail instead of carrying what the key
// would inject.
func newPollState(w *worker.Worker) *pollState {
	st := &pollState{w: w}
	for k := range nReqKinds {
		if k < reqModels && sources[k].parse == nil {
			continue // SourceNone
		}
		// The base URL was validated at registration, so this cannot fail.
		r, _ := http.NewRequest(http.MethodGet, w.URL.String()+k.path(), nil)
		if w.Spec.APIKey != "" {
			r.Header.Set("Authorization", "Bearer "+w.Spec.APIKey)
		}
		st.reqs[k] = r
	}
	return st
}

// result is one worker's poll outcome: entry when err is nil.
type result struct {
	entry Entry
	err   error
	at    time.Time
}

// scratch is one poll goroutine's reusable read buffer, and its gzip reader for the workers that
// compress their answer.
type scratch struct {
	buf []byte
	gz  *gzip.Reader
}

// errPollTimeout is why a poll that outlived Config.Timeout was cancelled.
var errPollTimeout = fmt.Errorf("load poll timed out: %w", context.DeadlineExceeded)

// pollDeadline bounds each poll of one poller goroutine by timeout without a context and a timer
// per poll: the goroutine's polls share one cancellable context and one timer, which start
// re-arms and stop disarms; only a poll that timed out (its context cancelled) makes the next
// poll take a new pair. A round polls a thousand workers every second, so this is a thousand
// contexts, timers and cancellation registrations a second fewer.
type pollDeadline struct {
	parent  context.Context
	timeout time.Duration

	ctx    context.Context // nil before the first poll and after a timeout
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

// start returns the context of the next poll, cancelled timeout from now (or with parent).
func (d *pollDeadline) start() context.Context {
	if d.ctx == nil {
		d.ctx, d.cancel = context.WithCancelCause(d.parent)
		cancel := d.cancel
		d.timer = time.AfterFunc(d.timeout, func() { cancel(errPollTimeout) })
		return d.ctx
	}
	d.timer.Reset(d.timeout)
	return d.ctx
}

// stop ends the current poll's deadline. If the timer already fired, the context is cancelled
// (or about to be), so the next poll gets a new one.
func (d *pollDeadline) stop() {
	if !d.timer.Stop() {
		d.cancel(errPollTimeout)
		d.ctx = nil
	}
}

// close releases the context and the timer.
func (d *pollDeadline) close() {
	if d.ctx != nil {
		d.timer.Stop()
		d.cancel(context.Canceled)
	}
}

// pollWorker polls one worker within ctx (one poll's deadline): it learns the runtime if needed,
// then tries the runtime's sources in order (the one that answered last first) until one yields
// a report.
func (m *Monitor) pollWorker(ctx context.Context, st *pollState, sc *scratch) result {
	start := m.cfg.Now()
	rt := m.runtimeOf(ctx, st, sc, start)
	srcs, n := sourceOrder(rt, st.source)
	var errs [2]error
	for i, src := range srcs[:n] {
		inflight, sent := st.w.Inflight(), m.cfg.Now()
		rep, err := m.fetchReport(ctx, st, src, rt, sc)
		if err == nil {
			rep.PolledAt, rep.InflightAtPoll = sent, inflight
			st.deriveThroughput(&rep, m.cfg.StaleAfter)
			st.prefill.Derive(&rep, m.cfg.StaleAfter)
			st.source = src
			return result{at: start, entry: Entry{Report: rep, Source: src, Runtime: rt, Latency: m.cfg.Now().Sub(start)}}
		}
		errs[i] = fmt.Errorf("%s: %w", src, err)
		if ctx.Err() != nil {
			break
		}
	}
	return result{at: start, err: errors.Join(errs[:]...)}
}

// deriveThroughput fills a report without a throughput gauge (vLLM) from the growth of its
// generated-tokens counter since the previous poll. The first poll, a counter that went back (a
// restarted worker), and polls less than nothing or more than maxGap apart give no rate, and the
// report stays without token data: least_load then ranks on effective load, as for any worker
// without token data.
func (st *pollState) deriveThroughput(r *Report, maxGap time.Duration) {
	prev, prevAt := st.genTotal, st.genAt
	st.genTotal, st.genAt = r.GenTokensTotal, r.PolledAt
	if r.HasTokenData || r.GenTokensTotal == 0 || prevAt.IsZero() {
		return
	}
	dt := r.PolledAt.Sub(prevAt)
	if dt <= 0 || dt > maxGap || r.GenTokensTotal < prev {
		return
	}
	r.GenThroughput = clampRate(float64(r.GenTokensTotal-prev) / dt.Seconds())
	r.HasTokenData = true
}

// sourceOrder returns the sources to try for runtime rt: vLLM serves only /metrics; SGLang and
// unknown runtimes are tried with /v1/loads first. A source that answered last
// time goes first, so a worker without /v1/loads costs one request per round, not two.
func sourceOrder(rt string, last Source) (srcs [2]Source, n int) {
	if rt == RuntimeVLLM {
		return [2]Source{SourceMetrics}, 1
	}
	if last == SourceMetrics {
		return [2]Source{SourceMetrics, SourceLoads}, 2
	}
	return [2]Source{SourceLoads, SourceMetrics}, 2
}

// fetchReport gets and parses one source.
func (m *Monitor) fetchReport(ctx context.Context, st *pollState, src Source, rt string, sc *scratch) (Report, error) {
	body, err := m.fetch(ctx, st, reqKind(src), sc)
	if err != nil {
		return Report{}, err
	}
	return sources[src].parse(body, rt)
}

// runtimeOf returns the worker's runtime: registered (Spec.Runtime, else the "runtime" label),
// else learned from /v1/models owned_by — probed once, retried after a failed probe — else "".
func (m *Monitor) runtimeOf(ctx context.Context, st *pollState, sc *scratch, now time.Time) string {
	if rt := normalizeRuntime(st.w.Runtime()); rt != "" {
		return rt
	}
	if rt := normalizeRuntime(st.w.Label("runtime")); rt != "" {
		return rt
	}
	if st.probed || now.Before(st.probeAfter) {
		return ""
	}
	owner, err := m.probeOwner(ctx, st, sc)
	if err != nil {
		st.probeAfter = now.Add(probeRetry * m.cfg.Interval)
		return ""
	}
	st.probed = true
	rt := normalizeRuntime(owner)
	if rt != "" {
		st.w.SetRuntime(rt)
		m.cfg.Logger.Info("worker runtime learned from /v1/models", "worker", st.w.Spec.URL, "runtime", rt)
	}
	return rt
}

// normalizeRuntime maps a runtime name or an owned_by value to RuntimeVLLM, RuntimeSGLang or "".
func normalizeRuntime(s string) string {
	s = strings.ToLower(s)
	switch {
	case strings.Contains(s, RuntimeVLLM):
		return RuntimeVLLM
	case strings.Contains(s, RuntimeSGLang):
		return RuntimeSGLang
	}
	return ""
}

// probeOwner returns the owned_by of the first model in the worker's /v1/models.
func (m *Monitor) probeOwner(ctx context.Context, st *pollState, sc *scratch) (string, error) {
	body, err := m.fetch(ctx, st, reqModels, sc)
	if err != nil {
		return "", fmt.Errorf("/v1/models: %w", err)
	}
	var models struct {
		Data []struct {
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil {
		return "", fmt.Errorf("/v1/models: %w", err)
	}
	for _, d := range models.Data {
		if d.OwnedBy != "" {
			return d.OwnedBy, nil
		}
	}
	return "", nil
}

// maxRedirects is how many redirects one poll request follows.
const maxRedirects = worker.MaxRedirects

// fetch sends request kind to the worker (following its redirects as send does) and returns the
// body, inflated if the worker gzipped it, read into sc's buffer (valid until sc's next fetch).
// A status other than 200, a body over MaxBody (inflated), another content encoding or a short
// body is an error.
func (m *Monitor) fetch(ctx context.Context, st *pollState, kind reqKind, sc *scratch) ([]byte, error) {
	resp, err := m.send(st.reqs[kind].WithContext(ctx))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Read a little so that the connection can be reused for the next poll.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		return nil, &StatusError{Code: resp.StatusCode}
	}
	if resp.ContentLength > int64(m.cfg.MaxBody) {
		return nil, ErrBodyTooLarge
	}
	body := io.Reader(resp.Body)
	switch enc := resp.Header.Get("Content-Encoding"); {
	case enc == "" || strings.EqualFold(enc, "identity"):
	case strings.EqualFold(enc, "gzip") || strings.EqualFold(enc, "x-gzip"):
		// The poll asks for no compression, but a worker that sends gzip anyway is read
		// like the plain answer; MaxBody bounds the inflated bytes, so a small bomb fails
		// the poll instead of filling memory (and Timeout bounds one that inflates to
		// nothing for ever).
		if err := sc.gunzip(resp.Body); err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		body = sc.gz
	default:
		return nil, ErrEncoding
	}
	return sc.read(body, m.cfg.MaxBody)
}

// send sends req through the transport, following up to maxRedirects redirects that stay on the
// worker's own scheme and host (vLLM once redirected /metrics to /metrics/). A redirect elsewhere
// is answered as its status: a worker must not point the gateway's polls, and its api key, at
// another address.
func (m *Monitor) send(req *http.Request) (*http.Response, error) {
	for hops := 0; ; hops++ {
		resp, err := m.cfg.Transport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		next := redirected(req, resp)
		if next == nil || hops == maxRedirects {
			return resp, nil
		}
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10) // so that the connection can be reused
		resp.Body.Close()
		req = next
	}
}

// redirected returns the request that follows resp's redirect, or nil when resp is no redirect
// to follow: not a 301, 302, 303, 307 or 308, no Location, or a Location off req's scheme and
// host. The new request is a GET with req's headers and context.
func redirected(req *http.Request, resp *http.Response) *http.Request {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return nil
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return nil
	}
	u, err := req.URL.Parse(loc)
	if err != nil || !worker.SameOrigin(req.URL, u) {
		return nil
	}
	next := req.Clone(req.Context())
	next.URL, next.Host = u, ""
	return next
}

// gunzip points sc's reusable gzip reader at r.
func (sc *scratch) gunzip(r io.Reader) error {
	if sc.gz == nil {
		gz, err := gzip.NewReader(r)
		sc.gz = gz
		return err
	}
	return sc.gz.Reset(r)
}

// read reads r to EOF into the reusable buffer, failing once more than limit bytes arrived.
func (sc *scratch) read(r io.Reader, limit int) ([]byte, error) {
	b := sc.buf[:0]
	for {
		if len(b) == cap(b) {
			grow := min(max(cap(b), 4<<10), limit+1-len(b))
			b = append(b, make([]byte, grow)...)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > limit {
			sc.keep(b)
			return nil, ErrBodyTooLarge
		}
		if err == io.EOF {
			sc.keep(b)
			return b, nil
		}
		if err != nil {
			sc.keep(b)
			return nil, err
		}
	}
}

// keep retains b's storage for the next read unless it grew past keepBuf.
func (sc *scratch) keep(b []byte) {
	if cap(b) <= keepBuf {
		sc.buf = b[:0]
	} else {
		sc.buf = nil
	}
}
