package loadmon

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Monitor polls every ready worker of a registry on an interval and publishes the results as an
// immutable Snapshot. Its Load and Report methods are the load view policies read (it satisfies
// policy.Loads). Create it with New; it polls only between Start and Stop, or on PollOnce.
type Monitor struct {
	reg *worker.Registry
	cfg Config // resolved: no zero fields

	// ownTransport: Config.Transport was nil, so the transport is the monitor's own, and Stop
	// closes its idle connections.
	ownTransport bool

	snap atomic.Pointer[Snapshot]
	// updated is closed, and replaced, at each round's publication (Updates).
	updated atomic.Pointer[chan struct{}]

	// pollMu serializes polling rounds; it guards states, round, targets, results and scratch.
	pollMu  sync.Mutex
	states  map[string]*pollState
	round   uint64
	targets []*pollState
	results []result
	scratch []*scratch

	// pubMu serializes publications: a round's snapshot against a removal's.
	pubMu sync.Mutex

	runMu  sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// armed is the context StartOnNeed gave, until Stop; needed records a Need.
	armed  context.Context
	needed bool
}

// New returns a Monitor of reg's workers. Zero fields of cfg take their defaults; New panics if
// cfg is invalid (check it with Validate first). New subscribes to reg so that a removed worker's
// entry disappears at once.
func New(reg *worker.Registry, cfg Config) *Monitor {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("loadmon.New: %v", err))
	}
	m := &Monitor{reg: reg, cfg: cfg.withDefaults(), states: map[string]*pollState{}, ownTransport: cfg.Transport == nil}
	m.snap.Store(emptySnapshot)
	ch := make(chan struct{})
	m.updated.Store(&ch)
	reg.Subscribe(m.onEvent)
	return m
}

// Config returns the monitor's configuration with every default resolved.
func (m *Monitor) Config() Config { return m.cfg }

// Start starts the poll loop: one round now, then one per Interval (a round that overruns the
// interval delays the next instead of overlapping it). The loop stops when ctx is done or on
// Stop. Calling Start on a running monitor does nothing.
func (m *Monitor) Start(ctx context.Context) {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.startLocked(ctx)
}

func (m *Monitor) startLocked(ctx context.Context) {
	if m.cancel != nil {
		return
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.wg.Go(func() { m.run(ctx) })
}

// StartOnNeed arms the monitor: polling starts under ctx at the first Need, or at once if a
// policy already needed it. Polling costs every worker a request per interval, so a gateway
// whose policies never read load never polls.
func (m *Monitor) StartOnNeed(ctx context.Context) {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.armed = ctx
	if m.needed {
		m.startLocked(ctx)
	}
}

// Need says a policy reads this monitor's load (policy.LazyLoads): the policy router calls it
// whenever it builds a load-aware policy, whether from the default name, a worker's policy label
// or a disaggregated pool's policy. It starts polling if StartOnNeed armed the monitor.
func (m *Monitor) Need() {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.needed = true
	if m.armed != nil {
		m.startLocked(m.armed)
	}
}

// Stop stops the poll loop, cancels the polls in flight, waits until every goroutine of the
// monitor has exited and closes its connections. The last snapshot stays readable; Start may be
// called again.
func (m *Monitor) Stop() {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.armed = nil
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
		m.cancel = nil
	}
	if c, ok := m.cfg.Transport.(interface{ CloseIdleConnections() }); ok && m.ownTransport {
		c.CloseIdleConnections()
	}
}

func (m *Monitor) run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.PollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Updates returns a channel closed when the next polling round's snapshot is published, so that
// a waiter (the gateway's queue) acts on fresh load without polling the Monitor.
func (m *Monitor) Updates() <-chan struct{} { return *m.updated.Load() }

// Snapshot returns the current snapshot; never nil.
func (m *Monitor) Snapshot() *Snapshot { return m.snap.Load() }

// Fresh reports whether e still counts: now − PolledAt ≤ StaleAfter.
func (m *Monitor) Fresh(e *Entry) bool { return e.Age(m.cfg.Now()) <= m.cfg.StaleAfter }

// Load returns w's load in requests under the configured Mode (Effective of w's in-flight count
// and its fresh entry; a worker without a fresh entry counts its in-flight requests only).
func (m *Monitor) Load(w *worker.Worker) int64 {
	local := w.Inflight()
	if m.cfg.Mode == ModeLocal {
		return local
	}
	r, fresh := m.Report(w)
	return Effective(m.cfg.Mode, local, r, fresh)
}

// Report returns w's last reported load, ok false when it has no fresh entry (never polled, last
// poll failed, or older than StaleAfter).
func (m *Monitor) Report(w *worker.Worker) (r Report, ok bool) {
	e, ok := m.snap.Load().entries[w.ID]
	if !ok || !m.Fresh(&e) {
		return Report{}, false
	}
	return e.Report, true
}

// WorkerLoad is one worker's row of GET /get_loads.
type WorkerLoad struct {
	// ID and URL identify the worker.
	ID  string `json:"id"`
	URL string `json:"url"`
	// Entry is the worker's snapshot entry; nil when it has none.
	Entry *Entry `json:"entry,omitempty"`
	// AgeSeconds is the entry's age; zero without an entry.
	AgeSeconds float64 `json:"age_seconds"`
	// Fresh reports whether the entry counts (it exists and is at most StaleAfter old).
	Fresh bool `json:"fresh"`
	// Failure is why the last poll failed; nil when it did not.
	Failure *Failure `json:"failure,omitempty"`
	// Local is this gateway's in-flight count for the worker.
	Local int64 `json:"local_inflight"`
	// Effective is the load policies see (Load).
	Effective int64 `json:"effective_load"`
}

// WorkerLoads returns a row for every registered worker, in registration order.
func (m *Monitor) WorkerLoads() []WorkerLoad {
	s, now := m.snap.Load(), m.cfg.Now()
	all := m.reg.View().All
	out := make([]WorkerLoad, 0, len(all))
	for _, w := range all {
		wl := WorkerLoad{ID: w.ID, URL: w.Spec.URL, Local: w.Inflight()}
		if e, ok := s.entries[w.ID]; ok {
			wl.Entry = &e
			wl.AgeSeconds = e.Age(now).Seconds()
			wl.Fresh = e.Age(now) <= m.cfg.StaleAfter
		}
		if f, ok := s.failures[w.ID]; ok {
			wl.Failure = &f
		}
		var r Report
		if wl.Fresh {
			r = wl.Entry.Report
		}
		wl.Effective = Effective(m.cfg.Mode, wl.Local, r, wl.Fresh)
		out = append(out, wl)
	}
	return out
}

// onEvent drops a removed worker's entry from the published snapshot at once.
func (m *Monitor) onEvent(ev worker.Event) {
	if !ev.Removed {
		return
	}
	m.pubMu.Lock()
	m.snap.Store(m.snap.Load().without(ev.Worker.ID))
	m.pubMu.Unlock()
}

// PollOnce polls every ready, non-draining worker once, concurrently (at most Concurrency at a
// time, each bounded by Timeout), and publishes the resulting snapshot. It returns when the
// snapshot is published, or without publishing if ctx is done.
func (m *Monitor) PollOnce(ctx context.Context) {
	m.pollMu.Lock()
	defer m.pollMu.Unlock()
	view := m.reg.View()
	targets := m.collectTargets(view)
	start := m.cfg.Now()
	results := m.pollAll(ctx, targets)
	if ctx.Err() != nil {
		return // shutting down: keep the last snapshot rather than publish cancelled polls
	}
	m.publish(view, targets, results, start)
}

// collectTargets returns the workers to poll this round, creating the state of new workers and
// dropping the state of workers that left the registry.
func (m *Monitor) collectTargets(view *worker.View) []*pollState {
	m.round++
	targets := m.targets[:0]
	for _, w := range view.All {
		st := m.states[w.ID]
		if st == nil || st.w != w {
			st = newPollState(w)
			m.states[w.ID] = st
		}
		st.round = m.round
		if w.Health() == worker.Ready && !w.Draining() {
			targets = append(targets, st)
		}
	}
	if len(m.states) > len(view.All) {
		for id, st := range m.states {
			if st.round != m.round {
				delete(m.states, id)
			}
		}
	}
	m.targets = targets
	return targets
}

// pollAll polls targets with a fixed number of goroutines that take the next target from a
// shared counter; it returns when every poll has ended. results[i] belongs to targets[i].
func (m *Monitor) pollAll(ctx context.Context, targets []*pollState) []result {
	n := len(targets)
	if cap(m.results) < n {
		m.results = make([]result, n)
	}
	results := m.results[:n]
	clear(results)
	g := min(m.cfg.Concurrency, n)
	for len(m.scratch) < g {
		m.scratch = append(m.scratch, &scratch{})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for k := range g {
		sc := m.scratch[k]
		wg.Go(func() {
			dl := pollDeadline{parent: ctx, timeout: m.cfg.Timeout}
			defer dl.close()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				results[i] = m.pollWorker(dl.start(), targets[i], sc)
				dl.stop()
			}
		})
	}
	wg.Wait()
	return results
}

// publish builds the round's snapshot, logs poll-state transitions and stores the snapshot.
func (m *Monitor) publish(view *worker.View, targets []*pollState, results []result, start time.Time) {
	now := m.cfg.Now()
	s := &Snapshot{At: now, Round: m.round, Took: now.Sub(start), Polled: len(targets),
		entries: make(map[string]Entry, len(targets))}
	for i, st := range targets {
		res := &results[i]
		id := st.w.ID
		if res.err == nil {
			if st.failures > 0 {
				m.cfg.Logger.Info("load poll recovered", "worker", st.w.Spec.URL, "failed_polls", st.failures)
			}
			st.failures, st.lastSuccess = 0, res.entry.Report.PolledAt
			s.entries[id] = res.entry
			continue
		}
		st.failures++
		if st.failures == 1 {
			m.cfg.Logger.Warn("load poll failing; worker routed on local load", "worker", st.w.Spec.URL, "err", res.err)
		}
		if s.failures == nil {
			s.failures = map[string]Failure{}
		}
		s.failures[id] = Failure{At: res.at, Err: res.err.Error(), Consecutive: st.failures, LastSuccess: st.lastSuccess}
	}
	setReplicas(s.entries)
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	if cur := m.reg.View(); cur != view {
		// Workers were added or removed during the round: drop those that left, so that a
		// removal published by onEvent is not undone.
		keep := make(map[string]bool, len(cur.All))
		for _, w := range cur.All {
			keep[w.ID] = true
		}
		for id := range s.entries {
			if !keep[id] {
				delete(s.entries, id)
			}
		}
		for id := range s.failures {
			if !keep[id] {
				delete(s.failures, id)
			}
		}
	}
	m.snap.Store(s)
	next := make(chan struct{})
	close(*m.updated.Swap(&next))
}

// setReplicas stamps every entry of a round with the round's replica estimate.
func setReplicas(entries map[string]Entry) {
	r := roundEstimate(func(yield func(Report) bool) {
		for _, e := range entries {
			if !yield(e.Report) {
				return
			}
		}
	})
	for id, e := range entries {
		e.Report.Replicas = r
		entries[id] = e
	}
}

// StampReplicas sets every report of one polling round to the round's replica estimate, as the
// monitor does for each snapshot. The fleet simulator calls it on its own rounds.
func StampReplicas(round []Report) {
	r := roundEstimate(slices.Values(round))
	for i := range round {
		round[i].Replicas = r
	}
}

// roundEstimate is EstimateReplicas over one round's sums of reported backlog and of this
// gateway's in-flight counts at the polls.
func roundEstimate(round iter.Seq[Report]) float64 {
	var backlog, local int64
	for r := range round {
		backlog = satAdd(backlog, r.Backlog())
		local = satAdd(local, r.InflightAtPoll)
	}
	return EstimateReplicas(backlog, local)
}
