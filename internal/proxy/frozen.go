package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// Frozen and dead workers.
//
// A request waiting for an answer's headers from an engine that does no work is sent elsewhere,
// in two cases where the engine cannot have done work a retry would duplicate:
//
//   - the worker fails its health checks while the attempt waits (a SIGSTOPped or wedged
//     engine answers neither): the attempt's context ends with errWorkerDown, and it is retried
//     as a refused connection (KindConnect). An engine that is only slow enough to fail its
//     checks may still finish the request: closing the connection tells vLLM and SGLang to abort
//     it, and the client gets one answer, the other engine's.
//   - the connection was reset before any byte of an answer and the engine now refuses new
//     connections (killed, or its process gone): its work died with it.
//
// Streams whose headers came are not moved: their bytes reached the client; they end with the
// SSE error event at the idle bound or when the connection breaks.

// errWorkerDown is the cause with which an attempt's context ends when its worker failed its
// health checks before the answer's headers came.
var errWorkerDown = errors.New("the worker failed its health checks before it answered")

// errEngineGone marks an attempt reset before its answer on an engine that then refused a
// connection.
var errEngineGone = errors.New("the engine reset the connection and now refuses new ones")

// refusalProbeTimeout bounds the dial that asks whether an engine that reset a connection still
// listens: a refusal on loopback or a LAN comes back in well under a millisecond.
const refusalProbeTimeout = 250 * time.Millisecond

// workerDown reports whether a's context ended because its worker failed its health checks
// (and not because the request itself ended).
func (a *attempt) workerDown(ctx context.Context) bool {
	return ctx.Err() == nil && a.ctx != nil && errors.Is(context.Cause(a.ctx), errWorkerDown)
}

// refusedAfterReset reports whether err is a connection reset (or an EOF before any answer) and
// the worker now refuses connections.
func (a *attempt) refusedAfterReset(err error) bool {
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !isEOFBeforeAnswer(err) {
		return false
	}
	host := a.w.URL.Host
	if a.w.URL.Port() == "" {
		port := "80"
		if a.w.URL.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(a.w.URL.Hostname(), port)
	}
	d := net.Dialer{Timeout: refusalProbeTimeout}
	c, derr := d.Dial("tcp", host)
	if derr == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(derr, syscall.ECONNREFUSED)
}

// isEOFBeforeAnswer reports whether err is a connection that closed before any byte of an
// answer: io.EOF or io.ErrUnexpectedEOF, or net/http's texts for it (their only mark). One is
// "server closed idle connection": the engine closed a connection before the request was
// counted on it. net/http resends such a request itself only on a reused connection, so a
// fresh one dialed just before the engine died ends with it.
func isEOFBeforeAnswer(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "server closed connection before") ||
		strings.Contains(msg, "server closed idle connection")
}
