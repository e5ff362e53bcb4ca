package testutil

import (
	"sync"
	"time"
)

// Clock is a clock that a test moves by hand: inject its Now where the code under test takes a
// func() time.Time. It is safe for concurrent use. The zero value reads the zero time.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock d forward (back, for a negative d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
