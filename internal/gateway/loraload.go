package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// LoRA load-on-demand (LoRAConfig.OnDemand, --lora-load-on-demand): a request for an adapter no
// registered worker lists, when the operator's allow-list names it, has the gateway load it on
// the least-cost worker of the base model that has a free adapter slot (vLLM's
// POST /v1/load_lora_adapter), and then goes there. A client can only name an adapter: where it
// is loaded from is the allow-list's, never the request's. At most LoRAConfig.MaxLoads loads run
// at once, gateway-wide; a request for an adapter being loaded waits for that load.

// LoRAConfig configures load-on-demand. The zero value is off.
type LoRAConfig struct {
	// OnDemand turns load-on-demand on. Default false.
	OnDemand bool
	// Sources is the allow-list: the adapters that may be loaded, by name, and the source each
	// is loaded from (the lora_path the engine is given). An adapter not in it is never loaded.
	Sources map[string]string
	// MaxLoads bounds the loads in flight at once; a request that would start one more is
	// answered 503. Default 2.
	MaxLoads int
	// MaxLoaded bounds the adapters the gateway keeps loaded on demand on one worker (the
	// engine's --max-cpu-loras, say); a worker at the bound takes another only by unloading one
	// idle past IdleUnload (loraidle.go). 0, the default, sets no bound and unloads nothing.
	MaxLoaded int
	// IdleUnload is how long an adapter loaded on demand goes without a request through this
	// gateway before it may be unloaded for another. Default 10m.
	IdleUnload time.Duration
	// Now is the clock of the idle times; nil means time.Now.
	Now func() time.Time
}

// loraLoader runs the loads: the bound, and the loads in flight by adapter.
type loraLoader struct {
	slots chan struct{}
	mu    sync.Mutex
	busy  map[string]chan struct{} // closed when that adapter's load ends
	// wg counts the background loads of adapters' copies (loracopy.go); copyRefused says the
	// last of them found no worker, for logging transitions only.
	wg          sync.WaitGroup
	copyRefused bool
	// used is when each allowed adapter was last requested through the gateway (loraidle.go);
	// full says the last load found every worker at MaxLoaded with nothing idle to unload.
	used map[string]time.Time
	full bool
}

func newLoraLoader(c LoRAConfig) *loraLoader {
	n := c.MaxLoads
	if n <= 0 {
		n = 2
	}
	return &loraLoader{slots: make(chan struct{}, n), busy: map[string]chan struct{}{}, used: map[string]time.Time{}}
}

// ParseLoRASources parses the allow-list flag: comma-separated NAME=SOURCE pairs.
func ParseLoRASources(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, src, ok := strings.Cut(f, "=")
		name, src = strings.TrimSpace(name), strings.TrimSpace(src)
		if !ok || name == "" || src == "" || len(name) > maxParentName || len(src) > 4096 ||
			strings.ContainsFunc(name+src, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '"' }) {
			return nil, fmt.Errorf("adapter source %q: want NAME=SOURCE, without quotes or control characters", f)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("adapter %q is named twice", name)
		}
		out[name] = src
	}
	return out, nil
}

// errLoadsBusy says the bound on concurrent loads is reached.
var errLoadsBusy = fmt.Errorf("adapter loads are at their bound")

// loadOnDemand loads model, an allowed adapter no worker lists, and returns its pool; nil with
// the status and message for the client when it cannot.
func (s *Server) loadOnDemand(ctx context.Context, model string) (*worker.Pool, int, string) {
	src, ok := s.cfg.LoRA.Sources[model]
	if !s.cfg.LoRA.OnDemand || !ok {
		return nil, http.StatusNotFound, fmt.Sprintf("the model %q does not exist", model)
	}
	base := baseModel(s.reg.View())
	if base == nil {
		return nil, http.StatusNotFound, fmt.Sprintf("the model %q does not exist, and the gateway serves no single base model to load it on", model)
	}
	l := s.loraLoads
	for {
		l.mu.Lock()
		if p := s.reg.View().Pool(model); p != nil {
			l.mu.Unlock()
			return p, 0, "" // loaded meanwhile
		}
		wait, loading := l.busy[model]
		if !loading {
			select {
			case l.slots <- struct{}{}:
			default:
				l.mu.Unlock()
				return nil, http.StatusServiceUnavailable, "the gateway is loading as many adapters as it may at once; retry shortly"
			}
			done := make(chan struct{})
			l.busy[model] = done
			l.mu.Unlock()
			err := s.loadOn(ctx, base, model, src)
			l.mu.Lock()
			delete(l.busy, model)
			close(done)
			l.mu.Unlock()
			<-l.slots
			if err != nil {
				s.log.Warn("adapter load failed", "model", model, "base", base.Model, "err", err)
				return nil, http.StatusServiceUnavailable, fmt.Sprintf("the adapter %q could not be loaded on any worker of %q", model, base.Model)
			}
			continue
		}
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, StatusClientClosed, ""
		}
		if s.reg.View().Pool(model) == nil {
			return nil, http.StatusServiceUnavailable, fmt.Sprintf("the adapter %q could not be loaded", model)
		}
	}
}

// baseModel is the pool of the one model served that is no adapter, nil when there are none
// or several.
func baseModel(v *worker.View) *worker.Pool {
	var base *worker.Pool
	for _, m := range v.Models {
		if p := v.Pool(m); p.Parent == "" && len(p.Regular) > 0 {
			if base != nil {
				return nil
			}
			base = p
		}
	}
	return base
}

// loadOn loads the adapter on the least-cost worker of base with a free slot (by its last
// report: fewer running adapters than max_lora; a worker reporting none counts as free), trying
// the others in cost order when one refuses, and records it there.
func (s *Server) loadOn(ctx context.Context, base *worker.Pool, model, src string) error {
	var free []*worker.Worker
	for _, w := range base.Regular {
		if !w.Available() || slices.Contains(w.Models(), model) {
			continue // down, or a copy already (loracopy.go)
		}
		if s.loads == nil {
			free = append(free, w)
			continue
		}
		if r, ok := s.loads.Report(w); ok && r.LoRA != nil && r.LoRA.MaxLoras > 0 && int64(len(r.LoRA.Running)) >= r.LoRA.MaxLoras {
			continue
		}
		free = append(free, w)
	}
	free = s.withRoom(ctx, free) // loraidle.go
	pol, err := s.router.For(base.Model, worker.Regular)
	if err != nil {
		return err
	}
	last := fmt.Errorf("no worker of %s has a free adapter slot", base.Model)
	for len(free) > 0 {
		req := &policy.Request{Model: base.Model}
		w := policy.Choose(ctx, pol, free, req)
		if w == nil {
			break
		}
		if last = s.postLoad(ctx, w, model, src); last == nil {
			s.log.Info("adapter loaded on demand", "model", model, "base", base.Model, "worker", w.ID)
			return s.reg.Learn(w.ID, model, base.Model)
		}
		free = removeWorker(free, w)
	}
	return last
}

// postLoad asks w to load the adapter. vLLM answers 400 when it has it already; that is success.
func (s *Server) postLoad(ctx context.Context, w *worker.Worker, model, src string) error {
	status, msg, err := s.postAdapter(ctx, w, "/v1/load_lora_adapter", map[string]string{"lora_name": model, "lora_path": src})
	switch {
	case err != nil:
		return err
	case status == http.StatusOK:
		return nil
	case status == http.StatusBadRequest && bytes.Contains(msg, []byte("already been loaded")):
		return nil
	}
	return fmt.Errorf("%s answered %d", w.ID, status)
}

// postAdapter posts fields as JSON to path on w, with the worker's own key, and returns the
// status and the first 4 KiB of the answer.
func (s *Server) postAdapter(ctx context.Context, w *worker.Worker, path string, fields map[string]string) (int, []byte, error) {
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL.String()+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if k := w.Spec.APIKey; k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, msg, nil
}

func removeWorker(ws []*worker.Worker, w *worker.Worker) []*worker.Worker {
	out := ws[:0]
	for _, x := range ws {
		if x != w {
			out = append(out, x)
		}
	}
	return out
}
