package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrivals says when sessions start. Exactly one of Rate and Concurrency is set, except for a
// timed workload (a trace), which with neither replays its recorded arrival times.
type Arrivals struct {
	// Rate is the open-loop arrival rate of new sessions per second (Poisson). Zero: not open loop.
	// For single-turn workloads sessions are requests.
	Rate float64
	// Concurrency is the closed-loop number of sessions in progress: a new session starts as soon
	// as one ends. Zero: not closed loop.
	Concurrency int
	// Speedup divides a trace's recorded arrival offsets (2 replays twice as fast). Zero means 1.
	Speedup float64
}

// Closed reports whether arrivals are a closed loop.
func (a Arrivals) Closed() bool { return a.Concurrency > 0 }

// Validate checks a against workload w.
func (a Arrivals) Validate(w Workload) error {
	_, timed := w.(Replay)
	switch {
	case a.Rate < 0 || math.IsNaN(a.Rate) || math.IsInf(a.Rate, 0):
		return fmt.Errorf("rate %v must be a finite number >= 0", a.Rate)
	case a.Concurrency < 0:
		return fmt.Errorf("concurrency %d must be >= 0", a.Concurrency)
	case a.Rate > 0 && a.Concurrency > 0:
		return errors.New("set either a rate (open loop) or a concurrency (closed loop), not both")
	case a.Rate == 0 && a.Concurrency == 0 && !timed:
		return errors.New("set a rate (open loop, sessions/s) or a concurrency (closed loop)")
	case a.Speedup < 0 || math.IsNaN(a.Speedup) || math.IsInf(a.Speedup, 0):
		return fmt.Errorf("speedup %v must be a finite number >= 0", a.Speedup)
	}
	return nil
}

// String describes a as shown in reports: "rate 12/s", "concurrency 64" or "trace times".
func (a Arrivals) String() string {
	switch {
	case a.Concurrency > 0:
		return fmt.Sprintf("concurrency %d", a.Concurrency)
	case a.Rate > 0:
		return fmt.Sprintf("rate %g/s", a.Rate)
	case a.Speedup > 0 && a.Speedup != 1:
		return fmt.Sprintf("trace times ×%g", a.Speedup)
	}
	return "trace times"
}

// Limits bound a run. A session or turn is not started once either limit is reached; requests in
// flight then finish. Zero fields mean no bound, but a run needs at least one bound unless the
// workload is finite.
type Limits struct {
	// Duration is how long new requests may start, from the start of the run.
	Duration time.Duration
	// Requests is the most requests that may be sent.
	Requests int
	// Warmup is the start of the run whose requests are sent but not measured, so that the
	// figures describe the steady state rather than cold caches. Zero measures everything.
	Warmup time.Duration
}

// Validate checks that l bounds a run of w.
func (l Limits) Validate(w Workload) error {
	_, finite := w.(Replay)
	switch {
	case l.Duration < 0:
		return fmt.Errorf("duration %v must be >= 0", l.Duration)
	case l.Requests < 0:
		return fmt.Errorf("requests %d must be >= 0", l.Requests)
	case l.Warmup < 0 || (l.Duration > 0 && l.Warmup >= l.Duration):
		return fmt.Errorf("warmup %v must be >= 0 and shorter than the duration", l.Warmup)
	case l.Duration == 0 && l.Requests == 0 && !finite:
		return errors.New("bound the run with a duration or a request count")
	}
	return nil
}

// Schedule hands out sessions in workload order and decides when each may start; it counts the
// requests sent against the limits. It is not safe for concurrent use: the fleet simulator is
// single-threaded and the live driver guards it with a mutex.
type Schedule struct {
	w      Workload
	a      Arrivals
	l      Limits
	rng    *rand.Rand
	next   int
	clock  time.Duration // open loop: arrival offset of the next session
	sent   int
	closed bool
}

// NewSchedule validates a and l for w and returns a schedule whose Poisson arrivals come from seed.
func NewSchedule(w Workload, a Arrivals, l Limits, seed uint64) (*Schedule, error) {
	if err := a.Validate(w); err != nil {
		return nil, err
	}
	if err := l.Validate(w); err != nil {
		return nil, err
	}
	return &Schedule{w: w, a: a, l: l, rng: rngFor(seed, 8, 0)}, nil
}

// Arrivals returns the arrival process.
func (s *Schedule) Arrivals() Arrivals { return s.a }

// Limits returns the run's bounds.
func (s *Schedule) Limits() Limits { return s.l }

// NextSession returns the next session and, under an open loop, its arrival offset from the start
// of the run. It returns false when the workload is exhausted or the next arrival falls after the
// duration limit.
func (s *Schedule) NextSession() (Session, time.Duration, bool) {
	// Every session sends at least one request, so no more sessions than requests are started.
	if s.closed || (s.l.Requests > 0 && (s.sent >= s.l.Requests || s.next >= s.l.Requests)) {
		return Session{}, 0, false
	}
	sess, ok := s.w.Session(s.next)
	if !ok {
		s.closed = true
		return Session{}, 0, false
	}
	s.next++
	var at time.Duration
	if !s.a.Closed() {
		switch {
		case s.a.Rate > 0:
			s.clock += time.Duration(s.rng.ExpFloat64() / s.a.Rate * float64(time.Second))
			at = s.clock
		case sess.Timed:
			sp := s.a.Speedup
			if sp == 0 {
				sp = 1
			}
			at = time.Duration(float64(sess.At) / sp)
		}
		if s.l.Duration > 0 && at >= s.l.Duration {
			s.closed = true
			return Session{}, 0, false
		}
	}
	return sess, at, true
}

// Admit reports whether a request may be sent at offset now, and counts it if so.
func (s *Schedule) Admit(now time.Duration) bool {
	if s.l.Duration > 0 && now >= s.l.Duration {
		return false
	}
	if s.l.Requests > 0 && s.sent >= s.l.Requests {
		return false
	}
	s.sent++
	return true
}

// Sent returns the number of requests admitted so far.
func (s *Schedule) Sent() int { return s.sent }

// Done reports whether no further request can be admitted at offset now.
func (s *Schedule) Done(now time.Duration) bool {
	return (s.l.Duration > 0 && now >= s.l.Duration) || (s.l.Requests > 0 && s.sent >= s.l.Requests)
}
