package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Answers bound to their requests.
//
// HTTP/1.1 has no field that ties an answer to its request: on a connection, the next answer is
// the next request's. A worker that sends one answer too many (a bug, or on purpose) shifts every
// later answer on that connection by one, and each client then gets the previous one's. When the
// extra answer arrives while the connection is idle, net/http sees it and closes the connection;
// when it arrives after the next request was written (a worker without TCP_NODELAY, or one that
// waits for it), no HTTP/1.1 client can tell it from the real answer.
//
// So every attempt carries an id the gateway chose (X-Request-Id; the client's own id stays in
// the gateway's logs and answers). Engines that echo it, in a response header (vLLM with
// --enable-request-id-headers, llm-d-inference-sim with the same flag, kvgate sim) or in the
// answer's "id" (vLLM's chatcmpl-<id> and cmpl-<id>, the first event of a stream), bind each
// answer: an answer on a reused connection that carries another id, or none from a worker that
// echoed before, is a stray. Its connection is closed, the attempt is sent again on a connection
// of its own (whose first answer can only be its own), the stray is counted and never relayed.
// For workers that echo nothing, Config.ConnReuse can give each request a connection of its own.

// attemptIDPrefix begins every id the gateway sends as X-Request-Id.
const attemptIDPrefix = "kvg-"

// newAttemptID returns a fresh id for one attempt: 64 random bits, so that no two attempts in
// flight share one and a worker cannot guess the next.
func newAttemptID() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return attemptIDPrefix + hex.EncodeToString(b[:])
}

// maxPeekBytes bounds how much of an answer's start is held to find its "id" (vLLM puts it
// first); an answer with none in these bytes is one that does not echo.
const maxPeekBytes = 4 << 10

// maxStrayResends bounds how many times one attempt is sent again after a stray. The resend goes
// on a fresh connection, whose first answer cannot be a stray, so one is enough; the second
// covers a transport that is not an *http.Transport (its connections may be reused).
const maxStrayResends = 2

// StrayObserver is an Observer that is also told of strays: answers on a reused connection that
// were not the answer to the request sent (how: "header" for another X-Request-Id, "body" for
// another answer id, "missing" for no id from a worker that echoed before).
type StrayObserver interface {
	StrayAnswer(w *worker.Worker, how string)
}

// connRef remembers the connection an attempt's request went out on, so that a stray's
// connection can be closed (net/http offers no other handle on it).
type connRef struct {
	trace  httptrace.ClientTrace
	mu     sync.Mutex
	conn   net.Conn
	reused bool
}

func newConnRef() *connRef {
	r := &connRef{}
	r.trace.GotConn = r.got
	return r
}

func (r *connRef) got(info httptrace.GotConnInfo) {
	r.mu.Lock()
	r.conn, r.reused = info.Conn, info.Reused
	r.mu.Unlock()
}

// closeConn closes the connection last used, so that net/http reads nothing more from it.
func (r *connRef) closeConn() {
	r.mu.Lock()
	c := r.conn
	r.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// wasReused reports whether the connection last used had carried an earlier request: only then
// can its answer be a stray.
func (r *connRef) wasReused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reused
}

// freshTransport returns a transport like t that never reuses a connection: every request is
// dialed anew. For a transport that is not an *http.Transport, t itself (requests then say
// "Connection: close").
func freshTransport(t http.RoundTripper) http.RoundTripper {
	if ht, ok := t.(*http.Transport); ok {
		c := ht.Clone()
		c.DisableKeepAlives = true
		return c
	}
	return t
}

// stray reports how a's answer is not the answer to its request ("" when it is), learning on the
// way what the worker echoes. Only an answer on a reused connection can be a stray.
func (a *attempt) stray(ctx context.Context, req *Request) (how string, e *Error) {
	resp, w := a.resp, a.w
	seen := w.Echo()
	v, hasHeader := resp.Header["X-Request-Id"]
	if hasHeader && len(v) == 1 && v[0] == a.id {
		w.NoteEcho(worker.EchoHeader)
		return "", nil
	}
	ok2xx := resp.StatusCode >= 200 && resp.StatusCode < 300
	if seen&worker.EchoHeader != 0 && a.conn.wasReused() {
		// A worker that echoed the id in a header before: another id is another request's
		// answer; none, on a success, is suspect. An id of its own from a worker never seen to
		// echo (a proxy in front of it that sets one) binds nothing.
		if hasHeader {
			return "header", nil
		}
		if ok2xx {
			return "missing", nil
		}
	}
	if !ok2xx || seen == worker.EchoNone || !echoesInBody(req.Path, resp) {
		// A worker seen not to echo is not read ahead: nothing would bind its answers.
		return "", nil
	}
	id, e := a.peekID(ctx, req)
	if e != nil {
		return "", e
	}
	switch {
	case id != "" && strings.Contains(id, a.id):
		w.NoteEcho(worker.EchoBody)
		return "", nil
	case seen&worker.EchoBody != 0 && a.conn.wasReused():
		if id == "" {
			return "missing", nil
		}
		return "body", nil
	}
	if seen&(worker.EchoBody|worker.EchoHeader) == 0 {
		w.NoteEcho(worker.EchoNone)
	}
	return "", nil
}

// echoesInBody reports whether an answer to path may carry the request id in its "id": the
// OpenAI completion routes, answered in JSON or as an event stream.
func echoesInBody(path string, resp *http.Response) bool {
	route, _, _ := strings.Cut(path, "?")
	if route != "/v1/chat/completions" && route != "/v1/completions" {
		return false
	}
	ct := resp.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "application/json") || strings.HasPrefix(ct, "text/event-stream")
}

// peekID reads the start of a's answer, up to its first "id" value or maxPeekBytes, and puts what
// it read back in front of the body for the relay. A stream's wait is bounded by
// Config.StreamIdleTimeout, as the relay's is.
func (a *attempt) peekID(ctx context.Context, req *Request) (string, *Error) {
	if req.Stream && a.cancel != nil && a.f.cfg.StreamIdleTimeout > 0 {
		cancel := a.cancel
		t := time.AfterFunc(a.f.cfg.StreamIdleTimeout, func() { cancel(errStreamIdle) })
		defer t.Stop()
	}
	// A streamed answer is read as events whatever its content type says, as the relay does.
	sse := req.Stream || strings.HasPrefix(a.resp.Header.Get("Content-Type"), "text/event-stream")
	buf := make([]byte, 0, 512)
	var rerr error
	id, found := "", false
	for len(buf) < maxPeekBytes && !found {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
		}
		n, err := a.resp.Body.Read(buf[len(buf):min(cap(buf), maxPeekBytes)])
		buf = buf[:len(buf)+n]
		id, found = answerID(buf)
		if !found && sse && firstDataEventEnd(buf) > 0 {
			// Only the first event of a stream is checked: the worker may wait for the
			// client to read it before it sends the next.
			found = true
		}
		if err != nil {
			rerr = err
			break
		}
	}
	if rerr != nil && rerr != io.EOF && len(buf) == 0 {
		return "", a.readFailed(ctx, rerr, a.resp.StatusCode)
	}
	a.resp.Body = &peekedBody{head: buf, err: rerr, ReadCloser: a.resp.Body}
	return id, nil
}

// answerID finds the value of the first "id" field in b; found is false while b may still be
// too short to hold it.
func answerID(b []byte) (id string, found bool) {
	i := bytes.Index(b, []byte(`"id"`))
	if i < 0 {
		return "", false
	}
	rest := bytes.TrimLeft(b[i+4:], " \t\r\n")
	if len(rest) == 0 {
		return "", false
	}
	if rest[0] != ':' {
		return "", true
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 {
		return "", false
	}
	if rest[0] != '"' {
		return "", true
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return "", false
	}
	return string(rest[1 : 1+end]), true
}

// peekedBody is an answer's body whose start was read ahead: head first, then err if the read
// ahead ended on one, then the rest.
type peekedBody struct {
	head []byte
	err  error
	io.ReadCloser
}

func (p *peekedBody) Read(b []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.ReadCloser.Read(b)
}

// dropStray closes the connection a stray came on, so that nothing else on it is read, counts
// it, and logs it with the ids that tell which request it answered.
func (a *attempt) dropStray(req *Request, how string) {
	got := a.resp.Header.Get("X-Request-Id")
	_ = a.resp.Body.Close()
	a.resp = nil
	a.conn.closeConn()
	if so, ok := a.f.obs.(StrayObserver); ok {
		so.StrayAnswer(a.w, how)
	}
	a.f.cfg.Logger.Warn("a worker's answer was not the answer to the request sent on its connection; the connection is closed and the request sent again on a new one",
		"request_id", req.RequestID, "attempt_id", a.id, "worker", a.w.ID, "how", how, "answer_request_id", loggable([]byte(got)))
}

// resend sends u once more on a new connection after a stray.
func (a *attempt) resend(ctx context.Context, u *http.Request) *Error {
	again := *u
	if u.GetBody != nil {
		body, err := u.GetBody()
		if err != nil {
			a.setFailure(KindTransport, worker.Abandoned)
			return &Error{Kind: KindTransport, Worker: a.w.ID, Err: err}
		}
		again.Body = body
	}
	again.Close = true
	a.rt = a.f.fresh
	return a.send(ctx, &again)
}

// errBadStatus is an answer whose status no HTTP/1.1 final answer may have.
var errBadStatus = errors.New("the worker answered with a status outside 200-599")

// validStatus fails an attempt whose answer's status is not a final one a client may be shown:
// below 200 (a 101 switch or an informational status net/http passed on, or a malformed 0-99)
// or above 599. The connection is closed: what follows on it cannot be trusted.
func (a *attempt) validStatus() *Error {
	code := a.resp.StatusCode
	if code >= 200 && code <= 599 {
		return nil
	}
	_ = a.resp.Body.Close()
	a.resp = nil
	a.conn.closeConn()
	a.setFailure(KindTransport, worker.Failed)
	return &Error{Kind: KindTransport, Worker: a.w.ID, Err: fmt.Errorf("%w: %d", errBadStatus, code)}
}

// sendBound sends u and waits for an answer that is its own: one with a valid status and, on a
// reused connection, not a stray (each stray's connection is closed and u sent again on a new
// one, up to maxStrayResends times).
func (a *attempt) sendBound(ctx context.Context, req *Request, u *http.Request) *Error {
	if e := a.send(ctx, u); e != nil {
		return e
	}
	for resends := 0; ; resends++ {
		if e := a.validStatus(); e != nil {
			return e
		}
		how, e := a.stray(ctx, req)
		if e != nil || how == "" {
			return e
		}
		a.dropStray(req, how)
		if resends == maxStrayResends {
			a.setFailure(KindTransport, worker.Failed)
			return &Error{Kind: KindTransport, Worker: a.w.ID, Err: errors.New("the worker answered another request's id on every connection")}
		}
		if e := a.resend(ctx, u); e != nil {
			return e
		}
	}
}

// firstDataEventEnd returns the index just past the first complete SSE event in b that has a
// data line (comments and other fields alone do not count), or 0 if b holds none yet.
func firstDataEventEnd(b []byte) int {
	start := 0
	for start < len(b) {
		end := lastEventEnd(b[start:min(len(b), start+nextEventEnd(b[start:]))])
		if end == 0 {
			return 0
		}
		ev := b[start : start+end]
		if bytes.HasPrefix(ev, []byte("data:")) || bytes.Contains(ev, []byte("\ndata:")) {
			return start + end
		}
		start += end
	}
	return 0
}

// nextEventEnd returns the length of b up to and including its first blank line, or len(b).
func nextEventEnd(b []byte) int {
	for i := 1; i < len(b); i++ {
		if b[i] == '\n' && (b[i-1] == '\n' || i >= 3 && b[i-1] == '\r' && b[i-2] == '\n' && b[i-3] == '\r') {
			return i + 1
		}
	}
	return len(b)
}
