package flow

import (
	"math"
	"time"
)

// Pool is what admission reads of the engines one queue dispatches to, at the moment it asks:
// the gateway's pool of workers, or a simulated replica's view of its engines.
type Pool interface {
	// Len returns the number of candidate engines.
	Len() int
	// Signals returns what is known of candidate i at now, its report terms judged on its
	// engine estimate (Saturation.Judge).
	Signals(i int, now time.Time) Signals
	// BestWait returns the routing cost's predicted wait, in seconds, before a request without a
	// prompt starts its prefill on the best candidate; ok false where the policy predicts none.
	BestWait() (wait float64, ok bool)
}

// Admission is one model's admission: its queue, the saturation gate that says how many more
// requests its pool takes, and the dispatch that grants queued requests on the pool's load of
// the moment. The gateway drives it in real time, the fleet simulator in virtual time, through
// the injected clock; neither keeps a copy of the gate. It is not safe for concurrent use (the
// gateway holds its lock around it).
type Admission struct {
	// Queue is the model's queue.
	Queue *Queue
	sat   Saturation
	now   func() time.Time
	open  []int
}

// NewAdmission returns the admission of one model configured by c, which must have had its
// defaults applied (Config.WithDefaults), its saturation gate c.Saturation, reading the time
// from now.
func NewAdmission(c Config, now func() time.Time) *Admission {
	return &Admission{Queue: NewQueue(c), sat: c.Saturation, now: now}
}

// Now returns the admission's clock's time.
func (a *Admission) Now() time.Time { return a.now() }

// maxDrain bounds the wait Headroom asks its caller to wake after, for a predicted wait of the
// routing cost, in seconds.
const maxDrain = 3600

// Headroom returns how many more requests p takes before every engine saturates, counted up to
// enough (the sum may stop there), and, when that is none, how soon an engine held back only by
// its queued prefill drains below the bound (0: none is): that prefill drains without an event,
// so the caller wakes itself then. Where the engines judged report no queued prefill of their
// own, the pool takes none while the routing cost predicts a wait at the bound on its best
// engine. Open then lists the candidates that could start a request.
func (a *Admission) Headroom(p Pool, now time.Time, enough float64) (room float64, next time.Duration) {
	sat := &a.sat
	a.open = a.open[:0]
	ownWait := false
	for i, n := 0, p.Len(); i < n; i++ {
		sig := p.Signals(i, now)
		if sat.CanStart(sig) {
			a.open = append(a.open, i)
		}
		ownWait = ownWait || sig.HasWait
		if room += sat.Headroom(sig); room >= enough {
			break
		}
		if d, ok := sat.Drain(sig); ok && (next == 0 || d < next) {
			next = d
		}
	}
	if room >= 1 && !ownWait {
		bound := sat.MaxPredictedWait.Seconds()
		if wait, ok := p.BestWait(); ok && wait >= bound {
			return 0, max(next, time.Duration(min(wait-bound, maxDrain)*float64(time.Second))+time.Millisecond)
		}
	}
	return room, next
}

// Open returns the candidates, by index, that could start a request at the last Headroom: a
// request dispatched then picks among them. The slice is reused by the next call.
func (a *Admission) Open() []int { return a.open }

// AdmitNow reports whether a request may go to an engine at once, without queueing: the queue is
// empty and the pool takes more than the pending requests (admitted, not yet at an engine).
func (a *Admission) AdmitNow(p Pool, pending float64) bool {
	room, _ := a.Headroom(p, a.now(), pending+1) // first: it moves the estimates on to fresh reports
	return a.Queue.Len() == 0 && room > pending
}

// Dispatch grants queued requests, best first, while the pool takes more than pending() (nil:
// none pending) reports, judging it afresh before each grant, so that a grant that reached an
// engine at once (the simulator's) or raised pending (the gateway's) is counted. It returns how
// soon the caller must dispatch again when only the engines' queued prefill holds the queue (0:
// not so).
func (a *Admission) Dispatch(p Pool, pending func() float64, grant func(e *Entry, now time.Time)) time.Duration {
	now := a.now()
	for a.Queue.Len() > 0 {
		room, next := a.Headroom(p, now, math.Inf(1))
		if pending != nil {
			room -= pending()
		}
		if room < 1 {
			return next
		}
		grant(a.Queue.Pop(now), now)
	}
	return 0
}

// Level returns the pool's saturation in [0,1]: the mean of its engines' levels, each with its
// own predicted wait, or, for an engine that reports no queued prefill, at least what the
// routing cost's predicted wait on the best engine stands for; 1 for an empty pool.
func (a *Admission) Level(p Pool) float64 {
	n := p.Len()
	if n == 0 {
		return 1
	}
	sat := &a.sat
	floor := 0.0
	if wait, ok := p.BestWait(); ok {
		floor = sat.WaitLevel(wait)
	}
	now := a.now()
	var sum float64
	for i := range n {
		sig := p.Signals(i, now)
		if sig.HasWait {
			sum += sat.Level(sig)
			continue
		}
		sum += max(sat.Level(sig), floor)
	}
	return sum / float64(n)
}
