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

// gatePool is a model's candidates as flow admission reads them (flow.Pool): each worker's
// signals judged on the gate's estimate of it, and the routing cost's prompt-less prediction on
// the best one; g.mu is held while it is read.
type gatePool struct {
	g          *flowGate
	candidates []*worker.Worker
	pol        policy.Policy
}

// pool returns the candidates as admission reads them.
func (g *flowGate) pool(candidates []*worker.Worker, pol policy.Policy) *gatePool {
	return &gatePool{g: g, candidates: candidates, pol: pol}
}

// Len returns the number of candidates.
func (p *gatePool) Len() int { return len(p.candidates) }

// Signals returns what the gate knows of candidate i now.
func (p *gatePool) Signals(i int, now time.Time) flow.Signals {
	return p.g.signals(p.candidates[i], now)
}

// BestWait returns the routing cost's predicted wait of a request without a prompt.
func (p *gatePool) BestWait() (float64, bool) { return p.g.predictedWait(p.candidates, p.pol) }

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

// saturation returns the model's pool saturation in [0,1] (flow.Admission.Level); 1 for an
// empty pool.
func (g *flowGate) saturation(model string, candidates []*worker.Worker, pol policy.Policy) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.model(model).a.Level(g.pool(candidates, pol))
}
