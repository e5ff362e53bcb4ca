package gateway

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// The flow gate's saturation judgement: each worker's signals (its fresh report corrected by the
// gate's loadmon.Estimate of it), the pool's headroom, the engines a dispatched request may pick,
// and the pool saturation the metrics export.

// engine returns the gate's estimate of w, creating it; g.mu is held.
func (g *flowGate) engine(w *worker.Worker) *loadmon.Estimate {
	e := g.engines[w]
	if e == nil {
		e = &loadmon.Estimate{}
		g.engines[w] = e
	}
	return e
}

// headroom is how many more requests the pool takes before every engine saturates (package
// flow's Saturation), counted up to enough (the caller's need: the sum may stop there); and,
// when that is none, how soon an engine held back only by its queued prefill drains below the
// bound (0: none is); g.mu is held. Where the engines judged report no queued prefill (no
// predicted wait of their own), none while the routing cost predicts a wait at the bound on the
// best engine.
func (g *flowGate) headroom(candidates []*worker.Worker, pol policy.Policy, enough float64) (room float64, next time.Duration) {
	sat := &g.cfg.Saturation
	now := g.now()
	ownWait := false
	for _, w := range candidates {
		sig := g.signals(w, now)
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
		if wait, ok := g.predictedWait(candidates, pol); ok && wait >= bound {
			return 0, max(next, time.Duration(min(wait-bound, 3600)*float64(time.Second))+time.Millisecond)
		}
	}
	return room, next
}

// predictedWait asks the routing cost for the wait of a request without a prompt: what stands
// before any new request's own prefill on the best engine.
func (g *flowGate) predictedWait(candidates []*worker.Worker, pol policy.Policy) (float64, bool) {
	c, ok := pol.(policy.Coster)
	if !ok {
		return 0, false
	}
	return c.BestCost(context.Background(), candidates, nil) // nil: a request without a prompt
}

// signals is what the gate knows of w now: its fresh report corrected by the gate's estimate;
// g.mu is held (the estimate moves on to a new report).
func (g *flowGate) signals(w *worker.Worker, now time.Time) flow.Signals {
	sig := flow.Signals{Available: w.Available(), Inflight: w.Inflight()}
	if g.s.loads == nil {
		return sig
	}
	r, ok := g.s.loads.Report(w)
	if !ok {
		return sig
	}
	g.cfg.Saturation.Judge(&sig, g.engine(w), &r, now)
	return sig
}

// startable returns the candidates that can start a request now (flow.Saturation.CanStart):
// a request the queue admitted picks among them, so that it is not sent to wait at an engine
// past its saturation point. It returns candidates itself when every one can, or none can.
func (g *flowGate) startable(candidates []*worker.Worker) []*worker.Worker {
	sat := &g.cfg.Saturation
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	var out []*worker.Worker
	for i, w := range candidates {
		ok := sat.CanStart(g.signals(w, now))
		switch {
		case ok && out != nil:
			out = append(out, w)
		case !ok && out == nil:
			out = make([]*worker.Worker, i, len(candidates))
			copy(out, candidates[:i])
		}
	}
	if len(out) == 0 {
		return candidates
	}
	return out
}

// saturation returns the model's pool saturation in [0,1]: the mean of its engines' levels
// (each with its own predicted wait, or, for an engine that reports no queued prefill, at least
// what the routing cost's predicted wait on the best engine stands for); 1 for an empty pool.
func (g *flowGate) saturation(candidates []*worker.Worker, pol policy.Policy) float64 {
	if len(candidates) == 0 {
		return 1
	}
	sat := &g.cfg.Saturation
	floor := 0.0
	if wait, ok := g.predictedWait(candidates, pol); ok {
		floor = sat.WaitLevel(wait)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	var sum float64
	for _, w := range candidates {
		sig := g.signals(w, now)
		if sig.HasWait {
			sum += sat.Level(sig) // its own predicted wait is in it
			continue
		}
		sum += max(sat.Level(sig), floor)
	}
	return sum / float64(len(candidates))
}
