package gateway

import (
	"context"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// A second copy of an adapter (load-on-demand, LoRAConfig.OnDemand): when every worker that
// serves an allowed adapter is past its saturation point (flow.Saturation.CanStart, the point
// past which the queue would hold a request back), the gateway loads the adapter on one more
// worker of its base model, the least-cost one with a free slot, in the background: the request
// that found the copies saturated is not delayed by the load, and those after it may go to the
// new copy once it serves. One load per adapter at a time, within LoRAConfig.MaxLoads; each
// copy added is logged, and so is the first refusal after a success (no worker has a free slot)
// and the first success after refusals, not every request that finds the copies saturated.

// loraCopyTimeout bounds one background load of an adapter's copy, in seconds of wall time.
const loraCopyTimeout = 30 * time.Second

// copyAdapter starts loading one more copy of pool's adapter when the allow-list names it and
// every worker of the pool is past saturation. It returns at once.
func (s *Server) copyAdapter(pool *worker.Pool) {
	if !s.cfg.LoRA.OnDemand || pool.Parent == "" {
		return
	}
	src, ok := s.cfg.LoRA.Sources[pool.Model]
	if !ok {
		return
	}
	l := s.loraLoads
	l.touch(pool.Model, s.loraNow())
	if !s.flow.pastSaturation(pool.Regular) {
		return
	}
	base := s.reg.View().Pool(pool.Parent)
	if base == nil {
		return
	}
	l.mu.Lock()
	if _, busy := l.busy[pool.Model]; busy {
		l.mu.Unlock()
		return
	}
	select {
	case l.slots <- struct{}{}:
	default:
		l.mu.Unlock()
		return // loads at their bound: a later request tries again
	}
	done := make(chan struct{})
	l.busy[pool.Model] = done
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), loraCopyTimeout)
		defer cancel()
		err := s.loadOn(ctx, base, pool.Model, src)
		l.mu.Lock()
		delete(l.busy, pool.Model)
		close(done)
		refused := l.copyRefused
		l.copyRefused = err != nil
		l.mu.Unlock()
		<-l.slots
		switch {
		case err != nil && !refused:
			s.log.Warn("adapter copies saturated, and no further copy could be loaded", "model", pool.Model, "base", base.Model, "copies", len(pool.Regular), "err", err)
		case err == nil && refused:
			s.log.Info("adapter copies can be added again", "model", pool.Model, "base", base.Model)
		}
	}()
}

// pastSaturation reports whether every worker of ws is past its saturation point (none can
// start a request without queueing it); false for none.
func (g *flowGate) pastSaturation(ws []*worker.Worker) bool {
	if len(ws) == 0 {
		return false
	}
	sat := &g.cfg.Saturation
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	return !slices.ContainsFunc(ws, func(w *worker.Worker) bool { return sat.CanStart(g.signals(w, now)) })
}

// waitLoraLoads waits for the background loads to end (Stop).
func (s *Server) waitLoraLoads() { s.loraLoads.wg.Wait() }
