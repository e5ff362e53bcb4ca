package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Relaying a worker's answer to the client: whole answers, and event streams cut only between
// events.

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// maxEventBytes bounds how much of one SSE event is held back waiting for its end; an event
// longer than this is passed through in pieces.
const maxEventBytes = 1 << 20

// relay copies the worker's response to the client. A streamed answer is flushed per chunk
// and, when it is an event stream, written only up to the end of its last complete event, so
// that a stream cut mid-event never shows the client half an event. A whole answer is committed
// only once its first bytes are in: one cut before them is an error the caller answers (502),
// not an empty reply.
func (a *attempt) relay(ctx context.Context, rw http.ResponseWriter, req *Request, start time.Time, res *Result) *Error {
	u := a.resp
	sse := strings.HasPrefix(u.Header.Get("Content-Type"), "text/event-stream")
	events := sse || (req.Stream && u.StatusCode < 300)
	flush := events || req.Stream || u.ContentLength < 0
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var idle *time.Timer
	if req.Stream && a.cancel != nil && a.f.cfg.StreamIdleTimeout > 0 {
		cancel := a.cancel
		idle = time.AfterFunc(a.f.cfg.StreamIdleTimeout, func() { cancel(errStreamIdle) })
		defer idle.Stop()
	}
	n, err := 0, error(nil)
	if !req.Stream && !sse {
		// A whole answer that fits the buffer is read whole before anything is committed: one
		// cut short is then a 502, not headers and an aborted connection the client could not
		// tell from no answer at all.
		whole := u.ContentLength > 0 && u.ContentLength <= int64(len(buf))
		for err == nil && (n == 0 || whole && int64(n) < u.ContentLength) {
			var m int
			m, err = u.Body.Read(buf[n:])
			n += m
		}
		if err != nil && err != io.EOF && (n == 0 || whole && int64(n) < u.ContentLength) {
			return a.readFailed(ctx, err, u.StatusCode)
		}
	}
	h := rw.Header()
	copyResponseHeader(h, u)
	if events {
		h.Del("Content-Length")
	}
	rw.WriteHeader(u.StatusCode)
	res.Status, res.Committed = u.StatusCode, true
	flusher, _ := rw.(http.Flusher)
	if !flush || flusher == nil {
		flusher = nopFlusher{}
	}
	flusher.Flush()
	held := 0          // buf[:held] is the start of an event not yet complete
	atBoundary := true // everything written so far ends between events
	var readErr error
	for first := n > 0 || err != nil; ; first = false {
		if !first {
			n, err = u.Body.Read(buf[held:])
		}
		if n > 0 {
			a.lease.FirstByte() // the worker is past its prefill (Worker.Awaiting)
			if idle != nil && !events {
				idle.Reset(a.f.cfg.StreamIdleTimeout)
			}
		}
		end := held + n
		out := end
		if events && err != io.EOF {
			// Write only complete events; on a read error the incomplete tail is dropped.
			out = lastEventEnd(buf[:end])
			if out == 0 && end == len(buf) && err == nil {
				if len(buf) < maxEventBytes {
					buf = append(buf[:end], make([]byte, len(buf))...)[:2*len(buf)]
					held = end
					continue
				}
				out = end // one huge event: pass it through in pieces
			}
		}
		if out > 0 {
			if idle != nil && events && firstDataEventEnd(buf[:out]) > 0 {
				// Only a complete data event is progress: comments, other fields and the bytes
				// of an event that never ends do not hold a stream open (Config.StreamIdleTimeout).
				idle.Reset(a.f.cfg.StreamIdleTimeout)
			}
			if res.FirstByte == 0 {
				res.FirstByte = time.Since(start)
			}
			if _, werr := rw.Write(buf[:out]); werr != nil {
				readErr = errClientGone{werr}
				break
			}
			flusher.Flush()
			atBoundary = !events || lastEventEnd(buf[:out]) == out
		}
		held = copy(buf, buf[out:end])
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if readErr == nil {
		if !flush {
			if f, ok := rw.(http.Flusher); ok {
				f.Flush()
			}
		}
		a.outcome = statusOutcome(u.StatusCode)
		return nil
	}
	e := a.readFailed(ctx, readErr, u.StatusCode)
	if e.Kind == KindCanceled {
		res.Status = 499
		return e
	}
	if !events {
		res.Abort = true
		return e
	}
	msg, code := "the worker's stream broke; the response is incomplete", "upstream_stream_broken"
	switch e.Kind {
	case KindShutdown:
		msg, code = "the gateway is shutting down; the response is incomplete", "gateway_shutting_down"
	case KindTimeout:
		msg, code = "the request reached the gateway's time limit; the response is incomplete", "request_timeout"
	case KindStreamIdle:
		msg, code = fmt.Sprintf("the worker sent no event for %v; the stream was ended", a.f.cfg.StreamIdleTimeout), "stream_idle_timeout"
	}
	writeSSEError(rw, msg, code, atBoundary)
	flusher.Flush()
	return e
}

// errStreamIdle is the cause with which an attempt's context ends when its stream was silent
// for Config.StreamIdleTimeout.
var errStreamIdle = errors.New("the worker's stream was idle too long")

// readFailed classifies a failed read of the worker's answer (status code) and records it.
func (a *attempt) readFailed(ctx context.Context, err error, code int) *Error {
	kind, outcome := classify(ctx, err, false, true)
	if a.ctx != nil && errors.Is(context.Cause(a.ctx), errStreamIdle) && kind != KindCanceled {
		// The worker hung mid-stream: its fault, whatever the read returned.
		kind, outcome = KindStreamIdle, worker.Failed
	}
	a.setFailure(kind, outcome)
	return &Error{Kind: kind, Worker: a.w.ID, LastStatus: code, Err: err}
}

type nopFlusher struct{}

func (nopFlusher) Flush() {}

// lastEventEnd returns the index just past the last blank line in b (the end of the last complete
// SSE event), or 0 if b holds none.
func lastEventEnd(b []byte) int {
	// Both separators end in '\n': walk back from the last newline, so that a buffer ending
	// on a complete event (the usual case) costs one step instead of two searches of it all.
	for p := len(b) - 1; ; p-- {
		p = bytes.LastIndexByte(b[:p+1], '\n')
		if p < 1 {
			return 0
		}
		if b[p-1] == '\n' || p >= 3 && b[p-1] == '\r' && b[p-2] == '\n' && b[p-3] == '\r' {
			return p + 1
		}
	}
}

// writeSSEError ends a broken stream with an OpenAI-shaped error event (code is its machine
// reason) and [DONE], so a client sees a clean end instead of a hang or a truncated event.
// atBoundary says the stream so far ends between events; if not, a blank line ends the partial
// one first.
func writeSSEError(w io.Writer, msg, code string, atBoundary bool) {
	var b bytes.Buffer
	if !atBoundary {
		b.WriteString("\n\n")
	}
	b.WriteString("data: {\"error\":{\"message\":")
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
