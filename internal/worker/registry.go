package worker

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// ErrDuplicate is returned by Registry.Add for a URL that is already registered.
var ErrDuplicate = errors.New("worker already registered")

// ErrNotFound is returned for an unknown worker id.
var ErrNotFound = errors.New("worker not found")

// View is an immutable picture of the registered workers. Never mutate a View or its slices.
type View struct {
	// All lists every registered worker in registration order.
	All []*Worker
	// byModel maps a model id to the workers serving it, by role, in registration order.
	byModel map[string]*Pool
	// Models lists the served model ids, sorted.
	Models []string
}

// Pool is the set of workers serving one model, split by role. Immutable.
type Pool struct {
	Model string
	// Parent is the base model when some worker lists Model as a LoRA adapter of it ("" for a
	// base model).
	Parent  string
	Regular []*Worker
	Prefill []*Worker
	Decode  []*Worker
}

// Disaggregated reports whether the pool routes through prefill/decode pairs.
func (p *Pool) Disaggregated() bool { return len(p.Prefill) > 0 && len(p.Decode) > 0 }

// Pool returns the pool for model, or nil.
func (v *View) Pool(model string) *Pool { return v.byModel[model] }

// Get returns the worker with id, or nil.
func (v *View) Get(id string) *Worker {
	for _, w := range v.All {
		if w.ID == id {
			return w
		}
	}
	return nil
}

// Event says a worker joined or left the registry.
type Event struct {
	Worker  *Worker
	Removed bool
}

// Registry holds the worker set. Readers call View, which takes no lock; writers build a new View.
type Registry struct {
	mu        sync.Mutex
	workers   []*Worker
	listeners []func(Event)
	view      atomic.Pointer[View]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.view.Store(buildView(nil))
	return r
}

// View returns the current immutable view.
func (r *Registry) View() *View { return r.view.Load() }

// Subscribe registers fn to be called after every Add and Remove, in order, outside the lock.
// Register listeners before workers are added; there is no unsubscribe.
func (r *Registry) Subscribe(fn func(Event)) {
	r.mu.Lock()
	r.listeners = append(r.listeners, fn)
	r.mu.Unlock()
}

// Add registers w. It fails with ErrDuplicate if a worker with the same URL exists.
func (r *Registry) Add(w *Worker) error {
	r.mu.Lock()
	for _, o := range r.workers {
		if o.ID == w.ID {
			r.mu.Unlock()
			return fmt.Errorf("%w: %s", ErrDuplicate, w.Spec.URL)
		}
	}
	r.workers = append(slices.Clip(r.workers), w)
	r.view.Store(buildView(r.workers))
	ls := r.listeners
	r.mu.Unlock()
	for _, fn := range ls {
		fn(Event{Worker: w})
	}
	return nil
}

// Remove unregisters the worker with id and returns it. The worker is drained first so that a
// request holding it finishes but no policy picks it again.
func (r *Registry) Remove(id string) (*Worker, error) {
	r.mu.Lock()
	i := slices.IndexFunc(r.workers, func(w *Worker) bool { return w.ID == id })
	if i < 0 {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	w := r.workers[i]
	w.Drain()
	r.workers = slices.Delete(slices.Clone(r.workers), i, i+1)
	r.view.Store(buildView(r.workers))
	ls := r.listeners
	r.mu.Unlock()
	for _, fn := range ls {
		fn(Event{Worker: w, Removed: true})
	}
	return w, nil
}

func buildView(ws []*Worker) *View {
	v := &View{All: slices.Clone(ws), byModel: map[string]*Pool{}}
	for _, w := range ws {
		for _, m := range w.Models() {
			p := v.byModel[m]
			if p == nil {
				p = &Pool{Model: m}
				v.byModel[m] = p
			}
			if pa := w.Parent(m); pa != "" && p.Parent == "" {
				p.Parent = pa
			}
			switch w.Spec.Type {
			case Prefill:
				p.Prefill = append(p.Prefill, w)
			case Decode:
				p.Decode = append(p.Decode, w)
			default:
				p.Regular = append(p.Regular, w)
			}
		}
	}
	for m := range v.byModel {
		v.Models = append(v.Models, m)
	}
	sort.Strings(v.Models)
	return v
}
