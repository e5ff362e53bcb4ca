package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/worker"
)

// Kind classifies why a request failed. Errors are classified once, here, and mapped to a status
// by Status; no other layer decides a status code for an upstream failure.
type Kind uint8

const (
	// KindTransport: the worker could not be reached or broke the connection (502).
	KindTransport Kind = iota
	// KindTimeout: the worker did not answer in time (504).
	KindTimeout
	// KindCanceled: the client went away (499, logged only). Never the worker's fault.
	KindCanceled
	// KindNoWorker: no worker was available (503).
	KindNoWorker
	// KindStatus: the worker answered with a retryable error status (its status is relayed).
	KindStatus
	// KindStreamBroken: the response broke after bytes reached the client.
	KindStreamBroken
	// KindConnect: the worker refused or did not take the connection; nothing was sent. When a
	// request's last attempt fails this way (every untried worker was tried first), the client
	// gets 503: no worker is available.
	KindConnect
	// KindShutdown: the gateway's shutdown grace period ended before the request did (503, or an
	// SSE error event once streaming). Never the worker's fault.
	KindShutdown
	// KindStreamIdle: a streamed answer on which the worker sent no complete data event for
	// Config.StreamIdleTimeout was ended (an SSE error event; 504 had nothing been sent).
	KindStreamIdle
)

// String returns the kind's metric label.
func (k Kind) String() string {
	switch k {
	case KindTimeout:
		return "timeout"
	case KindCanceled:
		return "canceled"
	case KindNoWorker:
		return "no_worker"
	case KindStatus:
		return "status"
	case KindStreamBroken:
		return "stream_broken"
	case KindConnect:
		return "connect"
	case KindShutdown:
		return "shutdown"
	case KindStreamIdle:
		return "stream_idle"
	default:
		return "transport"
	}
}

// ErrShuttingDown is the cancellation cause (context.WithCancelCause) with which a server ends the
// requests still running when its shutdown grace period is over; the proxy then ends them with a
// clear error instead of as if the client had left.
var ErrShuttingDown = errors.New("the gateway is shutting down")

// ErrNoWorker is wrapped by errors that mean no worker could take the request.
var ErrNoWorker = errors.New("no available worker")

// Error is a classified forwarding failure: everything the gateway needs to answer the client and
// to log, without reading the error's text.
type Error struct {
	Kind Kind
	// Worker is the id of the worker involved ("" for KindNoWorker).
	Worker string
	// StatusCode is the worker's status for KindStatus.
	StatusCode int
	// Attempts is the number of attempts the request made in all (0 when none was sent).
	Attempts int
	// LastStatus is the status of the last answer a worker gave this request, 0 if none did.
	LastStatus int
	// Last is the failure of the last attempt made, for a KindNoWorker error after attempts;
	// nil otherwise.
	Last *Error
	// Err is the underlying error, for logs.
	Err error
}

func (e *Error) Error() string {
	if e.Worker == "" {
		return fmt.Sprintf("proxy: %s: %v", e.Kind, e.Err)
	}
	return fmt.Sprintf("proxy: worker %s: %s: %v", e.Worker, e.Kind, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Status maps an error to the HTTP status the client should see: canceled → 499, timeout → 504,
// transport → 502, no worker → 503, a worker's status → that status.
func Status(err error) int {
	var e *Error
	if !errors.As(err, &e) {
		return http.StatusBadGateway
	}
	switch e.Kind {
	case KindCanceled:
		return 499
	case KindTimeout, KindStreamIdle:
		return http.StatusGatewayTimeout
	case KindNoWorker, KindShutdown:
		return http.StatusServiceUnavailable
	case KindStatus:
		return e.StatusCode
	default:
		return http.StatusBadGateway
	}
}

// errClientGone marks a failed write to the client: the client left.
type errClientGone struct{ err error }

func (e errClientGone) Error() string { return "writing to the client: " + e.err.Error() }
func (e errClientGone) Unwrap() error { return e.err }

// classify is the one place where what ended an attempt becomes a Kind and the worker's Outcome.
// ctx is the request's context; err what failed; timedOut whether the attempt's own header timer
// fired; relaying whether the response headers had arrived (bytes may have reached the client).
func classify(ctx context.Context, err error, timedOut, relaying bool) (Kind, worker.Outcome) {
	var gone errClientGone
	switch cerr := ctx.Err(); {
	case errors.As(err, &gone):
		return KindCanceled, worker.Abandoned
	case errors.Is(cerr, context.Canceled) && errors.Is(context.Cause(ctx), ErrShuttingDown):
		return KindShutdown, worker.Abandoned
	case errors.Is(cerr, context.Canceled):
		return KindCanceled, worker.Abandoned
	case cerr != nil && relaying:
		// The request's own time bound ran out while the answer was flowing: a long answer, not
		// a fault of the worker's.
		return KindTimeout, worker.Abandoned
	case cerr != nil, timedOut, isTimeout(err):
		return KindTimeout, worker.Failed
	case relaying:
		return KindStreamBroken, worker.Failed
	case isConnect(err):
		return KindConnect, worker.Failed
	}
	return KindTransport, worker.Failed
}

// statusOutcome is a worker's answer as its breaker sees it: 5xx are its fault; 4xx (the
// client's doing, or 429 back-pressure) are not.
func statusOutcome(code int) worker.Outcome {
	if code >= 500 {
		return worker.Failed
	}
	return worker.Succeeded
}

// isConnect reports whether err means the worker never got the request: the dial failed, or
// writing the request failed (a pooled connection the worker had closed: broken pipe, reset), so
// no engine can have started work on it.
func isConnect(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && (oe.Op == "dial" || oe.Op == "write")
}

// garbled reports whether err says the worker's answer did not parse as HTTP/1.1. net/http
// gives no type for that (its error is unexported), only this text, stable since Go 1.0.
func garbled(err error) bool { return strings.Contains(err.Error(), "malformed HTTP") }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
