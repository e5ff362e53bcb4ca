package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// H1 is the HTTP/1.1 transport for workers served over plain http. A request runs wholly on the
// goroutine that sends it: that goroutine writes the request, reads the response header, and
// (through the response body) reads the answer. net/http's Transport gives each connection a
// reading and a writing goroutine instead, and every request crosses to them and back: three
// hand-offs, each of which wakes a sleeping thread on a quiet machine (runtime.futex was about a
// sixth of the proxy's CPU at 1 KB bodies, for kvgate and httputil.ReverseProxy alike).
//
// What H1 keeps of net/http's behaviour: connections are pooled per worker and reused; a pooled
// connection the worker had closed is noticed before use when it has been idle a while, and
// otherwise the request is sent once more on a new connection when the reused one fails before
// any byte of an answer (what net/http does for a request marked idempotent, as the Forwarder
// marks every request: no engine can have started work on it); a request's context cancels it
// at any point, the body included; a response header is bounded in size; 1xx answers are
// skipped. What it leaves to Fallback: https, and request bodies of unknown length.
//
// A worker that answers before it has read the body, and then stops reading it, is heard as
// with net/http (see writeAlongAbove).
type H1 struct {
	// Fallback sends what H1 does not: https workers, and bodies of unknown length.
	Fallback http.RoundTripper
	// Dial opens a connection; nil means a net.Dialer with a 5 s timeout and 30 s keep-alive.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxResponseHeaderBytes bounds a response's header (every 1xx header before it included);
	// 0 means 64 KiB.
	MaxResponseHeaderBytes int64
	// MaxIdlePerHost bounds the idle connections kept per worker; 0 means 512.
	MaxIdlePerHost int
	// IdleTimeout closes a connection idle for this long; 0 means 90 s.
	IdleTimeout time.Duration

	mu      sync.Mutex
	idle    map[string][]*h1Conn // per host:port, most recently used last
	nidle   int
	sweeper *time.Timer // armed while any connection is idle
}

// NewH1 returns an H1 for plain-http workers in front of fallback, with fallback's limits: its
// response header bound, idle pool size per host and idle timeout.
func NewH1(fallback *http.Transport) *H1 {
	return &H1{
		Fallback:               fallback,
		MaxResponseHeaderBytes: fallback.MaxResponseHeaderBytes,
		MaxIdlePerHost:         fallback.MaxIdleConnsPerHost,
		IdleTimeout:            fallback.IdleConnTimeout,
	}
}

const (
	// h1BufferSize is each connection's read buffer, and the largest request (header and body)
	// assembled in one buffer and sent in one write.
	h1BufferSize = 32 << 10
	// peekAfter is how long a pooled connection may have been idle before it is checked for a
	// close by the worker: servers close idle connections after seconds (uvicorn after 5 s), and
	// a connection used a moment ago is not worth a system call.
	peekAfter = time.Second
	// max1xx bounds the informational answers skipped before the real one.
	max1xx = 8
)

// errStale marks a failure on a reused connection before any byte of an answer: the worker had
// closed it, and the request is sent again on a new one.
var errStale = errors.New("the pooled connection was closed by the worker")

// aLongTimeAgo is a deadline in the past: set on a connection, it makes every blocked read and
// write on it return at once.
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip implements http.RoundTripper.
func (t *H1) RoundTrip(req *http.Request) (*http.Response, error) {
	hasBody := req.Body != nil && req.Body != http.NoBody
	// A body with a length of 0 or less is of unknown length (as net/http reads it): chunked.
	if req.URL.Scheme != "http" || (hasBody && req.ContentLength <= 0) {
		if t.Fallback == nil {
			closeRequestBody(req)
			return nil, fmt.Errorf("proxy: H1 has no fallback for this request (scheme %q, body of unknown length %v)", req.URL.Scheme, hasBody && req.ContentLength <= 0)
		}
		return t.Fallback.RoundTrip(req)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeRequestBody(req)
		return nil, err
	}
	key := hostPort(req.URL.Host)
	for retried := false; ; retried = true {
		c, err := t.conn(ctx, key)
		if err != nil {
			closeRequestBody(req)
			return nil, err
		}
		resp, err := c.roundTrip(ctx, req)
		if err == nil {
			return resp, nil
		}
		if retried || !errors.Is(err, errStale) {
			return nil, err
		}
		// The worker closed the connection while it lay idle (a restart closes every one):
		// drop the rest of the host's pool, and send once more on a new connection.
		t.dropIdle(key)
		if hasBody {
			if req.GetBody == nil {
				return nil, err
			}
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r := *req
			r.Body = body
			req = &r
		}
	}
}

// closeRequestBody closes req's body, as a RoundTripper must even when it fails.
func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// hostPort is host with the default http port when it names none.
func hostPort(host string) string {
	if _, port, err := net.SplitHostPort(host); err == nil {
		if port == "" {
			return host + "80"
		}
		return host
	}
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		return host + ":80" // an IPv6 literal
	}
	return net.JoinHostPort(host, "80")
}

// CloseIdleConnections closes the idle connections of H1 and of its Fallback.
func (t *H1) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.nidle = nil, 0
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.close()
		}
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// conn returns a pooled connection to key that is not known to be closed, or a new one.
func (t *H1) conn(ctx context.Context, key string) (*h1Conn, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		cs := t.idle[key]
		if len(cs) == 0 {
			t.mu.Unlock()
			break
		}
		c := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		t.idle[key] = cs[:len(cs)-1]
		t.nidle--
		t.mu.Unlock()
		idle := now.Sub(c.idleAt)
		if idle >= t.idleTimeout() || (idle >= peekAfter && !c.alive()) {
			c.close()
			continue
		}
		c.reused = true
		return c, nil
	}
	dial := t.Dial
	if dial == nil {
		dial = workerDialer.DialContext
	}
	nc, err := dial(ctx, "tcp", key)
	if err != nil {
		return nil, err
	}
	c := &h1Conn{t: t, key: key, nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	c.lr = limitedConn{c: nc, n: math.MaxInt64}
	c.br = bufio.NewReaderSize(&c.lr, h1BufferSize)
	return c, nil
}

func (t *H1) idleTimeout() time.Duration {
	if t.IdleTimeout > 0 {
		return t.IdleTimeout
	}
	return 90 * time.Second
}

// put returns c to the pool, or closes it when the pool for its host is full.
func (t *H1) put(c *h1Conn) {
	c.idleAt = time.Now()
	max := t.MaxIdlePerHost
	if max <= 0 {
		max = 512
	}
	t.mu.Lock()
	if len(t.idle[c.key]) >= max {
		t.mu.Unlock()
		c.close()
		return
	}
	if t.idle == nil {
		t.idle = make(map[string][]*h1Conn)
	}
	t.idle[c.key] = append(t.idle[c.key], c)
	t.nidle++
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(t.idleTimeout(), t.sweep)
	}
	t.mu.Unlock()
}

// dropIdle closes every idle connection to key.
func (t *H1) dropIdle(key string) {
	t.mu.Lock()
	cs := t.idle[key]
	delete(t.idle, key)
	t.nidle -= len(cs)
	t.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// sweep closes the connections idle for longer than the idle timeout (a worker that left, or
// went quiet, keeps none open) and runs again while any connection is idle.
func (t *H1) sweep() {
	timeout := t.idleTimeout()
	now := time.Now()
	var expired []*h1Conn
	t.mu.Lock()
	for key, cs := range t.idle {
		keep := cs[:0]
		for _, c := range cs {
			if now.Sub(c.idleAt) >= timeout {
				expired = append(expired, c)
			} else {
				keep = append(keep, c)
			}
		}
		clear(cs[len(keep):])
		if len(keep) == 0 {
			delete(t.idle, key)
		} else {
			t.idle[key] = keep
		}
	}
	t.nidle -= len(expired)
	if t.nidle > 0 {
		t.sweeper.Reset(timeout)
	} else {
		t.sweeper = nil
	}
	t.mu.Unlock()
	for _, c := range expired {
		c.close()
	}
}

// limitedConn reads from c, at most n bytes in all until n is raised again: a response header
// is read with n at the header bound.
type limitedConn struct {
	c    net.Conn
	n    int64
	read int64 // bytes read since the request was written
}

// errHeaderTooLarge is a response header over H1.MaxResponseHeaderBytes.
var errHeaderTooLarge = errors.New("the worker's response header is too large")

func (l *limitedConn) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.c.Read(p)
	l.n -= int64(n)
	l.read += int64(n)
	return n, err
}

// h1Conn is one connection to a worker.
type h1Conn struct {
	t      *H1
	key    string
	nc     net.Conn
	raw    syscall.RawConn // nil when nc offers none: then it is never peeked
	lr     limitedConn
	br     *bufio.Reader
	wbuf   []byte // the request being assembled, kept for the next one
	reused bool
	idleAt time.Time
}

// interrupt makes every blocked read and write on c return; c is closed afterwards.
func (c *h1Conn) interrupt() { _ = c.nc.SetDeadline(aLongTimeAgo) }

func (c *h1Conn) close() { _ = c.nc.Close() }

// writeAlongAbove is the body size above which a request's write watches for a worker that
// stops reading: a worker may answer before it has read the body (an authentication filter's
// 401, a 413) and then read no more of it, which net/http's Transport hears because it reads
// the answer while it writes. A request up to this size always fits the sockets' buffers, so
// writing it first cannot wait on the worker. A larger one is written with a deadline of
// stallAfter; if the worker took none of it for that long, the rest is written by a goroutine
// of its own while the answer is read. The deadline costs a timer; a goroutine for every large
// body cost 3-10 % of the CPU per request at 1 MB (BenchmarkProxyCost, same rounds).
const (
	writeAlongAbove = 64 << 10
	stallAfter      = 50 * time.Millisecond
)

// roundTrip sends req on c and reads the answer's header; the answer's body reads from c and
// gives c back to the pool, or closes it, when it ends.
func (c *h1Conn) roundTrip(ctx context.Context, req *http.Request) (*http.Response, error) {
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, c.interrupt)
	}
	c.lr.read = 0
	resp, writing, werr, rerr := c.exchange(ctx, req)
	if resp != nil {
		return c.wrap(ctx, resp, stop, writing), nil
	}
	if stop != nil {
		stop()
	}
	c.close()
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case werr != nil && !errors.Is(werr, errBadRequest) && c.reused:
		return nil, fmt.Errorf("%w: %w", errStale, werr)
	case werr != nil:
		// The request did not go out whole: the worker cannot have started on it.
		return nil, werr
	case c.reused && c.lr.read == 0 && isClosedConn(rerr):
		return nil, fmt.Errorf("%w: %w", errStale, rerr)
	}
	return nil, rerr
}

// exchange writes req and reads the answer's header (see writeAlongAbove). writing, when not
// nil, is the result of a goroutine still writing the body: the worker answered before it read
// the whole body. With a response, werr is the write's failure if it already failed (the worker
// answered, then closed); without one, the write has ended.
func (c *h1Conn) exchange(ctx context.Context, req *http.Request) (resp *http.Response, writing chan error, werr, rerr error) {
	br, inMemory := req.Body.(*bodyReader)
	if req.ContentLength <= writeAlongAbove || !inMemory {
		werr = c.writeRequest(req)
		if errors.Is(werr, errBadRequest) {
			return nil, nil, werr, nil // nothing whole went out: there is no answer to wait for
		}
		return c.answer(req, werr)
	}
	head, err := c.head(req)
	if err != nil {
		closeRequestBody(req)
		return nil, nil, err, nil
	}
	data, err := br.unread(req.ContentLength)
	if err != nil {
		closeRequestBody(req)
		return nil, nil, err, nil
	}
	c.wbuf = head[:0]
	bufs := net.Buffers{head, data}
	_ = c.nc.SetWriteDeadline(time.Now().Add(stallAfter))
	_, werr = bufs.WriteTo(c.nc)
	if werr == nil || !isTimeout(werr) || ctx.Err() != nil {
		// Written (or failed for good: the context's interrupt, a broken connection).
		_ = c.nc.SetWriteDeadline(time.Time{})
		closeRequestBody(req)
		return c.answer(req, werr)
	}
	// The worker took nothing for stallAfter: write the rest alongside reading its answer.
	_ = c.nc.SetWriteDeadline(time.Time{})
	writing = make(chan error, 1)
	go func() {
		defer closeRequestBody(req)
		_, err := bufs.WriteTo(c.nc)
		writing <- err
	}()
	if resp, rerr = c.readResponse(req); rerr != nil {
		c.interrupt() // no answer: stop the write
		return nil, nil, <-writing, rerr
	}
	select {
	case werr = <-writing:
		if werr != nil {
			resp.Close = true
		}
		return resp, nil, werr, nil
	default:
		return resp, writing, nil, nil
	}
}

// answer reads the answer to a request whose write has ended, with werr. After a failed write
// the connection is broken and the read returns at once: with the answer of a worker that
// answered before it read the body and closed, if that came.
func (c *h1Conn) answer(req *http.Request, werr error) (*http.Response, chan error, error, error) {
	resp, rerr := c.readResponse(req)
	if resp != nil && werr != nil {
		resp.Close = true
	}
	return resp, nil, werr, rerr
}

// isClosedConn reports whether err is what reading a connection the peer closed gives.
func isClosedConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// readResponse reads the answer's header, skipping informational (1xx) answers, within the
// header bound.
func (c *h1Conn) readResponse(req *http.Request) (*http.Response, error) {
	limit := c.t.MaxResponseHeaderBytes
	if limit <= 0 {
		limit = 64 << 10
	}
	c.lr.n = limit
	defer func() { c.lr.n = math.MaxInt64 }()
	for range max1xx {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			if c.lr.n <= 0 {
				return nil, fmt.Errorf("%w (limit %d bytes)", errHeaderTooLarge, limit)
			}
			return nil, err
		}
		if resp.StatusCode >= 200 {
			return resp, nil
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("the worker switched protocols, which a proxied request never asks for")
		}
	}
	return nil, fmt.Errorf("the worker sent more than %d informational answers", max1xx)
}

// wrap gives resp a body that hands c back when it ends; stop (nil: none) unregisters the
// context's interrupt, and writing (nil: none) is the result of a body still being written.
func (c *h1Conn) wrap(ctx context.Context, resp *http.Response, stop func() bool, writing chan error) *http.Response {
	keep := !resp.Close && resp.ProtoAtLeast(1, 1)
	if resp.Body == http.NoBody {
		release(c, stop, writing, keep)
		return resp
	}
	resp.Body = &h1Body{c: c, rc: resp.Body, ctx: ctx, stop: stop, writing: writing, keep: keep}
	return resp
}

// release ends c's use by one request: back to the pool when keep holds, the context's
// interrupt did not run (it left a past deadline on c), the body's write (writing, if any) has
// ended well, and the worker sent nothing past the answer (bytes that would be read as the next
// request's answer); else closed, which also ends a write still under way.
func release(c *h1Conn, stop func() bool, writing chan error, keep bool) {
	if stop != nil && !stop() {
		keep = false
	}
	if writing != nil {
		select {
		case err := <-writing:
			keep = keep && err == nil
		default:
			keep = false
		}
	}
	if c.br.Buffered() > 0 {
		keep = false
	}
	if keep {
		c.t.put(c)
	} else {
		c.close()
	}
}

// h1Body is an answer's body on an H1 connection.
type h1Body struct {
	c       *h1Conn
	rc      io.ReadCloser
	ctx     context.Context
	stop    func() bool
	writing chan error // the request body's write, if still under way when the answer came
	keep    bool
	done    atomic.Bool // the connection was given back or closed
	eof     bool        // the body was read to its end
}

// errBodyClosed is a read after Close.
var errBodyClosed = errors.New("proxy: read on a closed response body")

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done.Load() {
		if b.eof {
			return 0, io.EOF
		}
		return 0, errBodyClosed
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.eof = true
		b.finish(b.keep)
	case err != nil:
		b.finish(false)
		if cerr := b.ctx.Err(); cerr != nil {
			err = cerr
		}
	}
	return n, err
}

// Close ends the body; a body not read to its end closes its connection (draining an answer
// nobody wants could take as long as the answer).
func (b *h1Body) Close() error {
	b.finish(false)
	return nil
}

func (b *h1Body) finish(keep bool) {
	if b.done.CompareAndSwap(false, true) {
		release(b.c, b.stop, b.writing, keep)
	}
}

// errBadRequest marks a request H1 refuses to write: a header field or target that would break
// the request's framing.
var errBadRequest = errors.New("proxy: invalid upstream request")

// writeRequest writes req's header and body to c and closes the body.
func (c *h1Conn) writeRequest(req *http.Request) error {
	defer closeRequestBody(req)
	head, err := c.head(req)
	if err != nil {
		return err
	}
	return c.send(req, head)
}

// head assembles req's header in c's write buffer, refusing (errBadRequest) a field or target
// that would break the request's framing. Nothing is sent.
func (c *h1Conn) head(req *http.Request) ([]byte, error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	target := req.URL.RequestURI()
	if !validTarget(target) || !validValue(host) || host == "" {
		return nil, fmt.Errorf("%w: bad target or host", errBadRequest)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	b := c.wbuf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		if ownField(k) {
			continue
		}
		if !validName(k) {
			return nil, fmt.Errorf("%w: header field name %q", errBadRequest, k)
		}
		for _, v := range vs {
			if !validValue(v) {
				return nil, fmt.Errorf("%w: value of header field %s", errBadRequest, k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if req.Close {
		b = append(b, "Connection: close\r\n"...)
	}
	if hasBody(req) || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, max(req.ContentLength, 0), 10)
		b = append(b, "\r\n"...)
	}
	return append(b, "\r\n"...), nil
}

// unread returns the next n bytes of the body, straight from its memory; fewer than n left is
// errBadRequest.
func (r *bodyReader) unread(n int64) ([]byte, error) {
	data := r.body[len(r.body)-r.Len():]
	if int64(len(data)) < n {
		return nil, fmt.Errorf("%w: body of %d bytes, %d declared", errBadRequest, len(data), n)
	}
	return data[:n], nil
}

// hasBody reports whether req has a body to send (of known length: RoundTrip hands the others to
// the fallback).
func hasBody(req *http.Request) bool {
	return req.Body != nil && req.Body != http.NoBody && req.ContentLength > 0
}

// send writes head, then req's body. A request up to h1BufferSize is assembled and sent in one
// write; a larger body in memory goes with its header in one vectored write, straight from that
// memory. A body that cannot be read in full is errBadRequest.
func (c *h1Conn) send(req *http.Request, b []byte) error {
	defer func() {
		if cap(b) <= h1BufferSize {
			c.wbuf = b[:0]
		}
	}()
	if !hasBody(req) {
		_, err := c.nc.Write(b)
		return err
	}
	n := req.ContentLength
	if br, ok := req.Body.(*bodyReader); ok {
		data, err := br.unread(n)
		if err != nil {
			return err
		}
		if len(b)+len(data) <= h1BufferSize {
			b = append(b, data...)
			_, err = c.nc.Write(b)
			return err
		}
		bufs := net.Buffers{b, data}
		_, err = bufs.WriteTo(c.nc)
		return err
	}
	if int64(len(b))+n <= h1BufferSize {
		head := len(b)
		b = append(b, make([]byte, n)...)
		if _, err := io.ReadFull(req.Body, b[head:]); err != nil {
			return fmt.Errorf("%w: reading the body: %w", errBadRequest, err)
		}
		_, err := c.nc.Write(b)
		return err
	}
	if _, err := c.nc.Write(b); err != nil {
		return err
	}
	buf := make([]byte, h1BufferSize)
	for n > 0 {
		k, rerr := req.Body.Read(buf[:min(int64(len(buf)), n)])
		if k > 0 {
			if _, err := c.nc.Write(buf[:k]); err != nil {
				return err
			}
			n -= int64(k)
		}
		if n > 0 && rerr != nil {
			return fmt.Errorf("%w: reading the body, %d bytes short: %w", errBadRequest, n, rerr)
		}
	}
	return nil
}

// ownFields are the fields H1 writes itself or never sends: framing and hop-by-hop fields (a
// body held whole needs no 100-continue).
var ownFields = [...]string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "Te", "Trailer", "Upgrade", "Keep-Alive", "Proxy-Connection"}

// ownField reports whether k, in any case, is one of ownFields.
func ownField(k string) bool {
	for _, f := range ownFields {
		if len(f) == len(k) && strings.EqualFold(f, k) {
			return true
		}
	}
	return false
}

// validName reports whether k is a header field name (an RFC 9110 token).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isTokenChar(k[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// validValue reports whether v may be sent as a header field value: no control character but
// horizontal tab (so no CR or LF that would end the field early).
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget reports whether a request target can go on the request line: no space or control
// character.
func validTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}
