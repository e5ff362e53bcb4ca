package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Unloading idle adapters (LoRAConfig.MaxLoaded, --lora-max-loaded): a worker holds at most
// MaxLoaded adapters the gateway loaded on demand. A load that finds every candidate at the
// bound makes room on one: it unloads, through the engine's POST /v1/unload_lora_adapter, the
// adapter there that has gone longest without a request through this gateway, when that is past
// LoRAConfig.IdleUnload; an adapter requested more recently is never unloaded, and one of the
// worker's registration never is. One unload per load at most. Each unload is logged; the state
// where no worker has room is logged when it begins and when it ends, not at every load.

// defaultIdleUnload is LoRAConfig.IdleUnload's default.
const defaultIdleUnload = 10 * time.Minute

func (s *Server) loraNow() time.Time {
	if s.cfg.LoRA.Now != nil {
		return s.cfg.LoRA.Now()
	}
	return time.Now()
}

// touch records that adapter was requested at t (adapters of the allow-list only, so the map is
// bounded by it).
func (l *loraLoader) touch(adapter string, t time.Time) {
	l.mu.Lock()
	l.used[adapter] = t
	l.mu.Unlock()
}

// loadedOnDemand returns the allowed adapters w learned (loaded by a gateway).
func (s *Server) loadedOnDemand(w *worker.Worker) []string {
	var out []string
	for _, m := range w.Models() {
		if _, ok := s.cfg.LoRA.Sources[m]; ok && w.Learned(m) {
			out = append(out, m)
		}
	}
	return out
}

// withRoom returns the workers of free below MaxLoaded; when none is, it makes room on one by
// unloading its longest-idle adapter past the bound, and returns that worker alone (none when
// no adapter is idle enough).
func (s *Server) withRoom(ctx context.Context, free []*worker.Worker) []*worker.Worker {
	bound := s.cfg.LoRA.MaxLoaded
	if bound <= 0 || len(free) == 0 {
		return free
	}
	var room []*worker.Worker
	for _, w := range free {
		if len(s.loadedOnDemand(w)) < bound {
			room = append(room, w)
		}
	}
	if len(room) > 0 {
		s.roomTransition(false)
		return room
	}
	idle := s.cfg.LoRA.IdleUnload
	if idle <= 0 {
		idle = defaultIdleUnload
	}
	now := s.loraNow()
	var pick *worker.Worker
	var victim string
	var oldest time.Time
	s.loraLoads.mu.Lock()
	for _, w := range free {
		for _, m := range s.loadedOnDemand(w) {
			if _, busy := s.loraLoads.busy[m]; busy {
				continue
			}
			if u := s.loraLoads.used[m]; now.Sub(u) >= idle && (pick == nil || u.Before(oldest)) {
				pick, victim, oldest = w, m, u
			}
		}
	}
	s.loraLoads.mu.Unlock()
	if pick == nil {
		s.roomTransition(true)
		return nil
	}
	if err := s.postUnload(ctx, pick, victim); err != nil {
		s.log.Warn("idle adapter unload failed", "model", victim, "worker", pick.ID, "err", err)
		return nil
	}
	s.reg.Unlearn(pick.ID, victim)
	s.log.Info("idle adapter unloaded to make room", "model", victim, "worker", pick.ID, "idle", now.Sub(oldest).Round(time.Second))
	s.roomTransition(false)
	return []*worker.Worker{pick}
}

// roomTransition logs when the state "no worker has room for another adapter" begins or ends.
func (s *Server) roomTransition(full bool) {
	l := s.loraLoads
	l.mu.Lock()
	was := l.full
	l.full = full
	l.mu.Unlock()
	switch {
	case full && !was:
		s.log.Warn("every worker holds its most adapters loaded on demand, none idle long enough to unload", "max_loaded", s.cfg.LoRA.MaxLoaded)
	case !full && was:
		s.log.Info("a worker has room for an adapter loaded on demand again")
	}
}

// postUnload asks w to unload the adapter. vLLM answers 404 when it has it no longer; that is
// success too.
func (s *Server) postUnload(ctx context.Context, w *worker.Worker, model string) error {
	status, _, err := s.postAdapter(ctx, w, "/v1/unload_lora_adapter", map[string]string{"lora_name": model})
	switch {
	case err != nil:
		return err
	case status == http.StatusOK || status == http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("%s answered %d", w.ID, status)
}
