package proxy

import (
	"errors"
	"fmt"
	"net/http"
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

// Error is a classified forwarding failure.
type Error struct {
	Kind Kind
	// Worker is the id of the worker involved ("" for KindNoWorker).
	Worker string
	// StatusCode is the worker's status for KindStatus.
	StatusCode int
	Err        error
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
	case KindTimeout:
		return http.StatusGatewayTimeout
	case KindNoWorker, KindShutdown:
		return http.StatusServiceUnavailable
	case KindStatus:
		return e.StatusCode
	default:
		return http.StatusBadGateway
	}
}

// retryableStatus reports whether a worker's status may succeed on another attempt (DESIGN §3).
func retryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// workerFault reports whether a status counts against the worker's circuit breaker: 5xx do; 4xx
// (the client's doing, or 429 back-pressure) do not.
func workerFault(code int) bool { return code >= 500 }
