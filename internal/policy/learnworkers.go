package policy

import "sync"

// perWorker is state learned per worker from the answers (the calibration, the capacities,
// the drift), bounded to maxCalibrated workers: workers come and go through Forget, and a flood
// of ids does not grow it. The zero value is empty and ready.
type perWorker[T any] struct {
	mu sync.Mutex
	m  map[string]*T
}

// update runs f on worker's state, created if needed, under the lock; not at all when the map
// is full and worker is not in it.
func (p *perWorker[T]) update(worker string, f func(*T)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[worker]
	if e == nil {
		if len(p.m) >= maxCalibrated {
			return
		}
		if p.m == nil {
			p.m = map[string]*T{}
		}
		e = new(T)
		p.m[worker] = e
	}
	f(e)
}

// read runs f on worker's state under the lock, if there is one.
func (p *perWorker[T]) read(worker string, f func(*T)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[worker]; e != nil {
		f(e)
	}
}

// forget drops worker's state.
func (p *perWorker[T]) forget(worker string) {
	p.mu.Lock()
	delete(p.m, worker)
	p.mu.Unlock()
}

// each returns worker → f(its state), for every worker whose f is ok.
func each[T, V any](p *perWorker[T], f func(*T) (V, bool)) map[string]V {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]V, len(p.m))
	for w, e := range p.m {
		if v, ok := f(e); ok {
			out[w] = v
		}
	}
	return out
}

// medianBin returns the bin of h's weighted median, ok false when h weighs nothing.
func medianBin(h []float64) (int, bool) {
	total := 0.0
	for _, w := range h {
		total += w
	}
	if !(total > 0) {
		return 0, false
	}
	acc := 0.0
	for i, w := range h {
		if acc += w; acc >= total/2 {
			return i, true
		}
	}
	return len(h) - 1, true
}
