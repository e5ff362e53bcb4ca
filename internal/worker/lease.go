package worker

import "time"

// Outcome is how one attempt on a worker ended, as the worker's books see it.
type Outcome uint8

const (
	// Succeeded: the worker did its part. Any answer that is not its fault counts, a client's
	// 4xx included.
	Succeeded Outcome = iota
	// Failed: the worker's fault (no connection, a broken answer, a 5xx, no answer in time). It
	// counts against the circuit breaker.
	Failed
	// Abandoned: the attempt ended for a reason that says nothing about the worker (the client
	// left, the gateway is shutting down, the request's own deadline ran out mid-answer). The
	// breaker does not hear of it.
	Abandoned
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Failed:
		return "failed"
	case Abandoned:
		return "abandoned"
	default:
		return "succeeded"
	}
}

// Lease is one admitted attempt on a worker: it holds an in-flight slot and, when the breaker is
// half-open, a probe slot. End settles both exactly once. A Lease is owned by the goroutine that
// runs the attempt and must not be copied after Begin; its zero value is an ended lease.
type Lease struct {
	w      *Worker
	ticket ticket
	// answered: the first byte of the answer arrived, and Awaiting no longer counts the attempt.
	answered bool
}

// Begin admits one attempt on w: the breaker must allow it and w must not be draining. On
// success the attempt counts in flight until the lease's End. The drain check follows the
// in-flight increment, so that a request is either counted when a drain starts or never sent.
func (w *Worker) Begin(now time.Time) (l Lease, admitted bool) {
	t, ok := w.Breaker.admit(now)
	if !ok {
		return Lease{}, false
	}
	w.inflight.Add(1)
	if w.draining.Load() {
		w.inflight.Add(-1)
		w.Breaker.settle(t, false, false)
		return Lease{}, false
	}
	w.awaiting.Add(1)
	return Lease{w: w, ticket: t}, true
}

// FirstByte records that the first byte of the answer's body arrived: the attempt no longer
// counts in the worker's Awaiting. Later calls, and calls after End, do nothing.
func (l *Lease) FirstByte() {
	if l.w == nil || l.answered {
		return
	}
	l.answered = true
	l.w.awaiting.Add(-1)
}

// End settles the lease: the in-flight slot is returned, the request counted as processed, and
// the breaker told o (unless o is Abandoned). Later calls do nothing.
func (l *Lease) End(o Outcome) {
	w := l.w
	if w == nil {
		return
	}
	if !l.answered {
		w.awaiting.Add(-1)
	}
	l.w = nil
	w.inflight.Add(-1)
	w.processed.Add(1)
	w.Breaker.settle(l.ticket, o == Succeeded, o != Abandoned)
}

// Worker returns the leased worker, or nil once the lease ended.
func (l *Lease) Worker() *Worker { return l.w }
