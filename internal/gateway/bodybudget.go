package gateway

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// A gateway-wide budget for request bodies held in memory.
//
// Every body is held whole, from its first byte until its last attempt is done (it is replayed
// on each retry, and a queued request keeps its own), so bodies are what clients can make the
// gateway hold: 8 concurrent 100 MB bodies took it to 1.7 GB. --max-payload-size bounds one
// body; BodyBudget bounds them all together: the buffers of every body being read, queued or in
// flight count against it, retries included (they share the body), and a body that would take
// the total past it waits up to Wait for room, then gets 503 with Retry-After.

// BodyBudget configures the gateway-wide bound on request-body memory.
type BodyBudget struct {
	// Bytes bounds the request-body buffers held at once, in bytes (--body-memory-budget).
	// Default DefaultBodyBudgetBytes; negative means no bound.
	Bytes int64
	// Wait is how long a body waits for room in the budget before its request gets 503
	// (--body-budget-wait). Default DefaultBodyBudgetWait.
	Wait time.Duration
}

// DefaultBodyBudgetBytes is the default BodyBudget.Bytes: a quarter of a 4 GiB container, 32
// bodies of the default --max-payload-size at once.
const DefaultBodyBudgetBytes = 1 << 30

// DefaultBodyBudgetWait is the default BodyBudget.Wait: a body that arrives while the budget is
// full usually finds room as soon as a request ends.
const DefaultBodyBudgetWait = time.Second

// DefaultMaxPayloadSize is the default Config.MaxPayloadSize: room for a million-token prompt
// written out in JSON several times over, or a few base64 images.
const DefaultMaxPayloadSize = 32 << 20

// budgetRetryAfter is the Retry-After, in seconds, of a request refused for the body budget.
const budgetRetryAfter = "1"

// bodyBudget counts the bytes of body buffers held, up to a limit. The zero value (limit 0) has
// no bound.
type bodyBudget struct {
	limit int64
	wait  time.Duration
	mu    sync.Mutex
	used  int64
	// freed is closed and replaced whenever bytes are given back, waking the waiters.
	freed chan struct{}
	// refused counts the requests refused for lack of room (a metric).
	refused int64
}

func newBodyBudget(c BodyBudget) *bodyBudget {
	b := &bodyBudget{limit: c.Bytes, wait: c.Wait, freed: make(chan struct{})}
	b.limit = cmp.Or(b.limit, DefaultBodyBudgetBytes)
	if b.wait <= 0 {
		b.wait = DefaultBodyBudgetWait
	}
	return b
}

// acquire takes n bytes, waiting up to the budget's Wait (or until ctx ends) for room; false if
// there was none. A request larger than the whole budget waits for nothing.
func (b *bodyBudget) acquire(ctx context.Context, n int64) bool {
	if b == nil || b.limit < 0 || n <= 0 {
		return true
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		if n > b.limit {
			b.refused++
			b.mu.Unlock()
			return false
		}
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(b.wait)
			defer timer.Stop()
		}
		select {
		case <-freed:
		case <-timer.C:
			b.mu.Lock()
			b.refused++
			b.mu.Unlock()
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// release gives back n bytes.
func (b *bodyBudget) release(n int64) {
	if b == nil || b.limit < 0 || n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// held returns the bytes held and the requests refused so far.
func (b *bodyBudget) held() (used, refused int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.refused
}
