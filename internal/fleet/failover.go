package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// validateFailover checks that every removal names by its index an engine that exists by then,
// that no addition names a URL (the simulator makes a new engine), and that the changes are in
// time order.
func validateFailover(c Config) error {
	n := c.Engines
	var last time.Duration
	removed := map[int]bool{}
	for _, ch := range c.Failover {
		if ch.At < last {
			return fmt.Errorf("fleet: failover %v comes before the previous change", ch)
		}
		last = ch.At
		if !ch.Remove {
			if ch.Arg != "" {
				return fmt.Errorf("fleet: failover %v: the simulator adds a new engine; give no URL", ch)
			}
			n++
			continue
		}
		i, ok := ch.Index()
		if !ok {
			return fmt.Errorf("fleet: failover %v: name the engine by its index", ch)
		}
		if i >= n || removed[i] {
			return fmt.Errorf("fleet: failover %v: no such engine at that time", ch)
		}
		removed[i] = true
		if len(removed) >= n {
			return fmt.Errorf("fleet: failover %v removes the last engine", ch)
		}
	}
	return nil
}

// engineName is engine i's name in records and timelines.
func engineName(i int) string { return "engine-" + strconv.Itoa(i) }

// scheduleFailover queues the configured worker changes.
func (s *sim) scheduleFailover() {
	for i, ch := range s.cfg.Failover {
		s.push(event{at: ch.At, kind: evWorker, idx: i})
	}
}

// change applies worker change i now.
func (s *sim) change(i int) {
	ch := s.cfg.Failover[i]
	if ch.Remove {
		idx, _ := ch.Index() // validated
		for _, g := range s.gws {
			w := g.workers[idx]
			w.Drain()
			g.cands = slices.DeleteFunc(slices.Clone(g.candidates()), func(x *worker.Worker) bool { return x == w })
			if f, ok := g.pol.(policy.Forgetter); ok {
				f.Forget(w.ID)
			}
			g.forgetAdapters(w.ID)
		}
		return
	}
	e, err := engine.New(s.cfg.engineConfig(len(s.engines)))
	if err != nil {
		return // the same config built every other engine
	}
	s.engines = append(s.engines, &simEngine{e: e})
	idx := len(s.engines) - 1
	if s.kv != nil {
		e.SetCacheObserver(engineEvents{s.kv, idx})
	}
	for _, g := range s.gws {
		g.addWorker(idx)
	}
	s.warmAdded(idx)
}

// addWorker gives this gateway a worker object for the new engine idx.
func (g *gateway) addWorker(idx int) {
	w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://engine-%d:8000", idx), Models: []string{simModel}}, worker.BreakerConfig{Disabled: true})
	if err != nil {
		return // a well-formed URL
	}
	w.SetHealth(worker.Ready)
	g.cands = append(slices.Clone(g.candidates()), w)
	g.workers = append(g.workers, w)
	g.index[w] = idx
	if g.kv != nil {
		// The replica subscribes to the new engine's events from its start, as to the others'.
		src := kvevents.Source{Worker: w.ID, Model: simModel}
		g.kv.srcs = append(g.kv.srcs, src)
		g.kv.idx.Expect(src)
	}
	g.reports = append(g.reports, loadmon.Report{})
	g.polled = append(g.polled, false)
}

// candidates returns the workers the policy chooses among now.
func (g *gateway) candidates() []*worker.Worker {
	if g.cands != nil {
		return g.cands
	}
	return g.workers
}

// recoveries analyses a timeline around each worker change of cfg: the span of a change runs
// until the next one; base, when not nil, is the timeline of the same run without changes,
// the reference window for window (else the hit rate from the previous change, or the warm-up's
// end, or half-way to the first change, up to this one).
func recoveries(cfg Config, warmup time.Duration, points, base []bench.TimelinePoint) []bench.Recovery {
	var out []bench.Recovery
	from := warmup.Seconds()
	added := cfg.Engines // the first engine added gets the next index
	for i, ch := range cfg.Failover {
		at := ch.At.Seconds()
		if i == 0 && from == 0 {
			from = at / 2
		}
		until := 0.0
		if i+1 < len(cfg.Failover) {
			until = cfg.Failover[i+1].At.Seconds()
		}
		idx, _ := ch.Index()
		name, newName := "remove "+engineName(idx), ""
		if !ch.Remove {
			newName = engineName(added)
			added++
			name = "add " + newName
		}
		out = append(out, bench.RecoveryAfter(points, base, name, newName, from, at, until, 0.02))
		from = at
	}
	return out
}

// compareUndisturbed runs c again without its worker changes, on the same schedule, and judges
// s's recoveries against that run window for window: the simulator is deterministic, so what
// differs is what the changes did, not the workload's own variation.
func (x *Experiment) compareUndisturbed(ctx context.Context, c Config, a bench.Arrivals, s *bench.Summary) error {
	sched, err := bench.NewSchedule(x.Workload, a, x.Limits, x.Seed)
	if err != nil {
		return err
	}
	undisturbed := c
	undisturbed.Failover = nil
	base, err := Run(ctx, undisturbed, sched)
	if err != nil {
		return fmt.Errorf("%s undisturbed: %w", c.Label(), err)
	}
	s.Recoveries = recoveries(c, x.Limits.Warmup, s.Timeline, base.Timeline)
	s.Undisturbed = base.Timeline
	return nil
}
