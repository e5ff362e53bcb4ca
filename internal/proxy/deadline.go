package proxy

import (
	"context"
	"sync"
	"time"
)

// deadlines bounds every request of a Forwarder by the same duration with one timer for all of
// them, where context.WithTimeout takes a runtime timer per request (allocated, put on a heap,
// taken off again when the request ends well before its bound, as nearly all do). Requests are
// bounded by one duration, so their deadlines come in the order they start: the bounded
// requests are a list in deadline order, a request joins at its tail and leaves from wherever
// it is, and the timer is set for the head. It is set again only when it fires (for the new
// head, or not at all when none is left), never when a request leaves: at one request at a
// time, a timer is touched once per bound, not twice per request.
//
// What a request's context promises is the same as context.WithTimeout's: Deadline reports
// the bound; Done closes when the bound passes, when the parent ends (the client left, the
// gateway shuts down) or when the request ends; Err is context.DeadlineExceeded after the
// bound passed and the parent's error after the parent ended; Cause is the parent's cause, or
// DeadlineExceeded. Nothing keeps running when no request is bounded: the timer is not set
// again once the list is empty, and no goroutine waits on it.
type deadlines struct {
	d time.Duration

	mu         sync.Mutex
	head, tail *deadlineCtx
	timer      *time.Timer // set for head's deadline while armed; created on first use
	armed      bool
}

// deadlineCtx is a request's context under its bound. The embedded context is a cancelCtx of
// the request's own (Done, Value and Cause are its), so that a context derived from it (the
// transport's per-request one) hangs directly off it, as off a context.WithTimeout's, with no
// goroutine to watch it.
type deadlineCtx struct {
	context.Context
	cancel     context.CancelCauseFunc
	deadline   time.Time
	prev, next *deadlineCtx
	listed     bool // in the list; guarded by the list's mu
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Err is DeadlineExceeded once the bound passed, as a context.WithTimeout's is; the bound is
// cancelled with that cause, so an end for another reason first (whose cause stays) is
// reported as that reason.
func (c *deadlineCtx) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == context.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return err
}

func (c *deadlineCtx) String() string { return "proxy.deadlineCtx" }

// bound returns parent bounded by the list's duration from now. The caller must call release
// when the request ends.
func (l *deadlines) bound(parent context.Context) *deadlineCtx {
	inner, cancel := context.WithCancelCause(parent)
	c := &deadlineCtx{Context: inner, cancel: cancel}
	if pd, ok := parent.Deadline(); ok && !pd.After(time.Now().Add(l.d)) {
		// The parent ends first and ends inner with its own error: nothing to list (as
		// context.WithDeadline does with an earlier parent deadline).
		c.deadline = pd
		return c
	}
	l.mu.Lock()
	// Read under the lock, so that the list stays in deadline order.
	c.deadline = time.Now().Add(l.d)
	c.prev, c.listed = l.tail, true
	if l.tail != nil {
		l.tail.next = c
	} else {
		l.head = c
	}
	l.tail = c
	if !l.armed {
		l.armed = true
		if l.timer == nil {
			l.timer = time.AfterFunc(l.d, l.expire)
		} else {
			l.timer.Reset(l.d)
		}
	}
	l.mu.Unlock()
	return c
}

// release ends c's request: c leaves the list and its context is cancelled (Canceled, as a
// context.WithTimeout's cancel func does).
func (l *deadlines) release(c *deadlineCtx) {
	l.mu.Lock()
	l.unlink(c)
	l.mu.Unlock()
	c.cancel(nil)
}

// unlink removes c from the list if it is in it; l.mu is held.
func (l *deadlines) unlink(c *deadlineCtx) {
	if !c.listed {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
}

// expire runs when the timer fires: it ends every request whose bound has passed and sets the
// timer for the next one, if any.
func (l *deadlines) expire() {
	var due []*deadlineCtx
	l.mu.Lock()
	now := time.Now()
	for c := l.head; c != nil && !c.deadline.After(now); c = l.head {
		l.unlink(c)
		due = append(due, c)
	}
	if l.head != nil {
		l.timer.Reset(l.head.deadline.Sub(now))
	} else {
		l.armed = false
	}
	l.mu.Unlock()
	for _, c := range due {
		c.cancel(context.DeadlineExceeded)
	}
}
