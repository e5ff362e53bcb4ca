package fleet

import (
	"maps"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// warmRun is one gateway replica's warm-up of an engine added by Config.Failover, in virtual
// time: what the gateway does when a worker joins (internal/gateway/warm.go), with the same
// plan (policy.PlanWarm) and the same recording rule (policy.Warmed only on success).
type warmRun struct {
	g        *gateway
	w        *worker.Worker
	eng      int
	texts    []string
	next     int               // index of the next text to send
	inflight map[uint64]string // request id → text
	done     []string          // the texts whose warm request succeeded
	deadline time.Duration
	over     bool // ended (all answered, or the deadline): nothing more is sent or recorded
}

// warmAdded starts every replica's warm-up of the engine just added as idx, if warming is on.
// Each replica plans from its own tree and sends its own requests, as separate gateways do.
func (s *sim) warmAdded(idx int) {
	if !s.cfg.Warm.Enabled() {
		return
	}
	cfg := s.cfg.Warm.WithDefaults()
	for _, g := range s.gws {
		w := g.workers[idx]
		texts := policy.PlanWarm(g.pol, w.ID, cfg, epoch.Add(s.now), s.cfg.RoutingPrefixBytes)
		if len(texts) == 0 {
			continue
		}
		r := &warmRun{g: g, w: w, eng: idx, texts: texts, inflight: map[uint64]string{}, deadline: s.now + cfg.Timeout}
		w.SetWarming(true) // this replica routes nothing to it until the warm-up ends
		s.warms = append(s.warms, r)
		s.push(event{at: r.deadline, kind: evWarmDeadline, idx: len(s.warms) - 1})
		for range cfg.Concurrency {
			s.warmNext(r)
		}
	}
}

// warmNext sends r's next prompt to its engine, if there is one and r may still send.
func (s *sim) warmNext(r *warmRun) {
	if r.over || r.next >= len(r.texts) || r.w.Draining() {
		return
	}
	text := r.texts[r.next]
	r.next++
	if s.warmStats == nil {
		s.warmStats = &bench.WarmStats{}
	}
	s.warmStats.Sent++
	id := s.nextID
	s.nextID++
	if err := s.engines[r.eng].e.Submit(s.now, engine.Request{ID: id, Text: text, MaxTokens: 1}); err != nil {
		s.warmStats.Failed++
		s.warmNext(r)
		return
	}
	r.inflight[id] = text
	s.flights[id] = &flight{warm: r, release: r.w.Acquire(), sent: s.now, eng: r.eng}
	s.wake(r.eng)
}

// warmFinished handles the end of warm request ev of f, and sends the next one. Once every
// request has ended the prefixes that succeeded are recorded for the new worker.
func (s *sim) warmFinished(f *flight, ev engine.Event) {
	r := f.warm
	f.release()
	text, ok := r.inflight[ev.ID]
	if !ok {
		return
	}
	delete(r.inflight, ev.ID)
	s.warmStats.PromptTokens += int64(ev.PromptTokens)
	s.warmStats.CachedTokens += int64(ev.CachedTokens)
	r.done = append(r.done, text)
	s.warmNext(r)
	if len(r.inflight) == 0 {
		s.warmEnd(r)
	}
}

// warmEnd ends r: the prefixes whose warm request succeeded are recorded for the new worker,
// all at once and only if it is still in the pool (gateway/warm.go says why at the end).
func (s *sim) warmEnd(r *warmRun) {
	if r.over {
		return
	}
	r.over = true
	r.w.SetWarming(false)
	if r.w.Draining() {
		s.warmStats.Failed += len(r.done)
		return
	}
	for _, text := range r.done {
		policy.Warmed(r.g.pol, r.w.ID, text)
	}
	s.warmStats.Recorded += len(r.done)
}

// warmDeadline ends warm-up i: its requests still running are aborted, as the gateway cancels
// them, and count as failed.
func (s *sim) warmDeadline(i int) {
	r := s.warms[i]
	if r.over {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(r.inflight)) { // in order: runs stay deterministic
		if s.engines[r.eng].e.Abort(s.now, id) {
			if f := s.flights[id]; f != nil {
				f.release()
				delete(s.flights, id)
			}
			s.warmStats.Failed++
		}
		delete(r.inflight, id)
	}
	s.warmEnd(r)
	s.wake(r.eng)
}
