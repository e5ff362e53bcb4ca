package policy

import (
	"maps"
	"math"
	"sync/atomic"
)

// Drift: precise_prefix's events index checked against the answers. The index is what the
// engines announced; the answer is what the engine really reused. They disagree now and then
// (a block evicted between the decision and the prefill), but an index that keeps disagreeing
// with a worker's answers has drifted from its engine: events were lost without a sequence gap
// to show it, or the engine restarted under the same publisher. Every precise decision records
// the events' Ĉ of each candidate (Basis.Events); each answer of the chosen worker says whether
// it agreed (within correctSlackTokens, in the tokens the events could see). A worker whose
// answers disagreed more often than driftOn of the time (a moving share, weight driftWeight,
// after driftMinAnswers answers) is drifting: its Ĉ comes from the prefix tree (as for an
// engine without events) until the share falls below driftOff. The index is still read for it
// and compared with its answers, so it comes back once the events agree again (a resync, the
// engine's new events).

const (
	driftWeight     = 1.0 / 8
	driftOn         = 0.5
	driftOff        = 0.25
	driftMinAnswers = 4
)

// drifts keeps each worker's disagreement share and state.
type drifts struct {
	perWorker[driftState]
	// now is the set of drifting workers, republished on every transition: decisions read it
	// without the lock.
	now atomic.Pointer[map[string]bool]
}

type driftState struct {
	share    float64
	n        int
	drifting bool
	count    int
}

// drift returns s as DriftReporter reports it.
func (s *driftState) drift() Drift { return Drift{Drifting: s.drifting, Count: s.count} }

// Drift is one worker's drift state (DriftReporter).
type Drift struct {
	// Drifting: the worker's events index disagrees with its answers; its Ĉ comes from the tree.
	Drifting bool
	// Count is how many times it started drifting.
	Count int
}

// DriftReporter is implemented by policies that check their events index against the answers.
type DriftReporter interface {
	// Drifts returns worker id → its drift state, for the workers whose answers were compared.
	Drifts() map[string]Drift
	// WorkerDrift returns worker's drift state.
	WorkerDrift(worker string) Drift
}

// observe records whether worker's answer agreed with its events.
func (d *drifts) observe(worker string, agree bool) {
	d.update(worker, func(s *driftState) {
		miss := 0.0
		if !agree {
			miss = 1
		}
		s.n++
		s.share += (miss - s.share) * max(driftWeight, 1/float64(s.n))
		switch {
		case !s.drifting && s.n >= driftMinAnswers && s.share > driftOn:
			s.drifting = true
			s.count++
		case s.drifting && s.share < driftOff:
			s.drifting = false
		default:
			return
		}
		set := map[string]bool{}
		for w, st := range d.m { // under the lock update holds
			if st.drifting {
				set[w] = true
			}
		}
		d.now.Store(&set)
	})
}

// drifting reports whether worker's index is drifting.
func (d *drifts) drifting(worker string) bool {
	set := d.now.Load()
	return set != nil && (*set)[worker]
}

// forget drops worker's state.
func (d *drifts) forget(worker string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, worker)
	if set := d.now.Load(); set != nil && (*set)[worker] {
		next := maps.Clone(*set)
		delete(next, worker)
		d.now.Store(&next)
	}
}

// Drifts returns each compared worker's drift state (DriftReporter).
func (p *Cost) Drifts() map[string]Drift {
	return each(&p.drift.perWorker, func(s *driftState) (Drift, bool) { return s.drift(), true })
}

// WorkerDrift returns worker's drift state (DriftReporter).
func (p *Cost) WorkerDrift(worker string) (d Drift) {
	p.drift.read(worker, func(s *driftState) { d = s.drift() })
	return d
}

// undrift records, for each candidate the events answered for (out[i] ≥ 0, of toks tokens),
// what they said, and takes the drifting ones off the events (out[i] = −1: the tree scores
// them). It reports whether it took any.
func (p *Cost) undrift(av []costCand, toks int, out []int) bool {
	took := false
	for i := range av {
		if out[i] < 0 {
			continue
		}
		b := &av[i].basis
		b.Events, b.EventsOf, b.Evented = float64(out[i]), float64(toks), true
		if p.drift.drifting(av[i].w.ID) {
			out[i], took = -1, true
		}
	}
	return took
}

// learnDrift compares worker's answer (reported tokens cached) with what its events said.
func (p *Cost) learnDrift(b *Basis, worker string, reported float64) {
	if !b.Evented {
		return
	}
	seen := min(reported, b.EventsOf) // the events see only the tokens they were asked about
	p.drift.observe(worker, math.Abs(b.Events-seen) <= correctSlackTokens)
}
