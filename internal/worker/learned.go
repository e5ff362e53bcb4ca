package worker

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// Models a worker was found to serve after it registered: LoRA adapters the gateway loaded on it
// (gateway load-on-demand). Spec stays immutable; these are kept beside it, and the registry's
// views count them as the worker's models.

// learned is the models learned after registration and their parents (adapter → base model).
// Never changed once published.
type learned struct {
	models  []string
	parents map[string]string
}

// learnedModels holds a worker's learned models; the zero value holds none.
type learnedModels struct{ p atomic.Pointer[learned] }

// Models returns the worker's models: its registration's, then those learned since.
func (w *Worker) Models() []string {
	l := w.learned.p.Load()
	if l == nil {
		return w.Spec.Models
	}
	return append(slices.Clip(w.Spec.Models), l.models...)
}

// Parent returns the base model of model when the worker serves it as a LoRA adapter, else "".
func (w *Worker) Parent(model string) string {
	if p := w.Spec.Parents[model]; p != "" {
		return p
	}
	if l := w.learned.p.Load(); l != nil {
		return l.parents[model]
	}
	return ""
}

// maxLearnedModels bounds the models one worker may learn after registration.
const maxLearnedModels = 1024

// Learn records that the registered worker with id now serves model, an adapter of parent, and
// publishes a view that routes it there. Learning a model the worker already serves changes
// nothing.
func (r *Registry) Learn(id, model, parent string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.workers, func(w *Worker) bool { return w.ID == id })
	if i < 0 {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	w := r.workers[i]
	if slices.Contains(w.Models(), model) {
		return nil
	}
	old := w.learned.p.Load()
	next := &learned{parents: map[string]string{}}
	if old != nil {
		if len(old.models) >= maxLearnedModels {
			return fmt.Errorf("worker %s has learned %d models, the most it may", id, maxLearnedModels)
		}
		next.models = slices.Clone(old.models)
		for k, v := range old.parents {
			next.parents[k] = v
		}
	}
	next.models = append(next.models, model)
	if parent != "" {
		next.parents[model] = parent
	}
	w.learned.p.Store(next)
	r.view.Store(buildView(r.workers))
	return nil
}

// Unlearn records that the registered worker with id no longer serves model, a model it learned
// after registration (an adapter the gateway unloaded), and publishes a view without it there.
// A model of the worker's registration, or one it never learned, is left: false.
func (r *Registry) Unlearn(id, model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.workers, func(w *Worker) bool { return w.ID == id })
	if i < 0 {
		return false
	}
	w := r.workers[i]
	old := w.learned.p.Load()
	if old == nil || !slices.Contains(old.models, model) {
		return false
	}
	next := &learned{models: slices.DeleteFunc(slices.Clone(old.models), func(m string) bool { return m == model }), parents: map[string]string{}}
	for k, v := range old.parents {
		if k != model {
			next.parents[k] = v
		}
	}
	w.learned.p.Store(next)
	r.view.Store(buildView(r.workers))
	return true
}

// Learned reports whether the worker serves model only because it learned it after registration.
func (w *Worker) Learned(model string) bool {
	l := w.learned.p.Load()
	return l != nil && slices.Contains(l.models, model) && !slices.Contains(w.Spec.Models, model)
}
