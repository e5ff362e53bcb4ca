package zmtp

import (
	"context"
	"sync"
)

// Budget is a number of bytes shared by every peer of one or more sockets: each frame charges
// it as its bytes arrive (never at the size its header announces) and a received message keeps
// its charge until the consumer releases it, so that frames being read and messages waiting in
// receive queues together never hold more than the budget, whatever the peers send. A reader
// that finds the budget spent waits (its peer is not read meanwhile, so TCP pushes back and the
// publisher drops at its own high-water mark, which the receiver sees as a sequence gap).
//
// Create it with NewBudget; safe for concurrent use.
type Budget struct {
	limit int64

	mu   sync.Mutex
	used int64
	free chan struct{} // closed and replaced whenever bytes are released
}

// NewBudget returns a budget of limit bytes (at least 1).
func NewBudget(limit int64) *Budget {
	return &Budget{limit: max(limit, 1), free: make(chan struct{})}
}

// Limit returns the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Used returns the bytes charged now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// acquire charges n bytes, waiting for room until ctx is done. A charge larger than the whole
// budget can never succeed and fails at once.
func (b *Budget) acquire(ctx context.Context, n int64) error {
	if n > b.limit {
		return ErrFrameTooLarge
	}
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		free := b.free
		b.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryAcquire charges n bytes if there is room now.
func (b *Budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

// release returns n bytes to the budget.
func (b *Budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic("zmtp: budget released more than it was charged")
	}
	close(b.free)
	b.free = make(chan struct{})
	b.mu.Unlock()
}
