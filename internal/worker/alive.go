package worker

import "context"

// aliveCtx is one period of a worker's life between two failures of its health checks.
type aliveCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// Alive returns a context that ends when w next fails its health checks (its health becomes
// NotReady): a frozen or dead engine does no work, so what waits on it for an answer's headers
// can go elsewhere (the proxy registers with context.AfterFunc; no goroutine waits on it). The
// context never ends otherwise; a worker whose health recovers gets a new one.
func (w *Worker) Alive() context.Context {
	for {
		if a := w.alive.Load(); a != nil {
			return a.ctx
		}
		ctx, cancel := context.WithCancel(context.Background())
		if w.alive.CompareAndSwap(nil, &aliveCtx{ctx, cancel}) {
			return ctx
		}
		cancel()
	}
}

// failedHealth ends the current Alive context.
func (w *Worker) failedHealth() {
	if a := w.alive.Swap(nil); a != nil {
		a.cancel()
	}
}
