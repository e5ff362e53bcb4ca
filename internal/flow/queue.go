package flow

import (
	"container/heap"
	"errors"
	"time"
)

// Entry is one queued request. The caller sets Tenant, Priority, Cost, Bytes and, optionally,
// Deadline and Owner before Push; the Queue owns the rest until the entry leaves it.
type Entry struct {
	// Tenant is the request's tenant (the fair-share key within a band).
	Tenant string
	// Weight is the tenant's weight (Tenant.Weight); zero counts as 1.
	Weight float64
	// Priority is the request's priority; Push clamps it into [MinPriority, MaxPriority].
	Priority int
	// Cost is what the request costs its tenant's share, in estimated prompt tokens; below 1
	// counts as 1.
	Cost float64
	// Bytes is the request's body size, counted against Config.MaxBytes.
	Bytes int64
	// Deadline is when the request leaves the queue unserved; zero means Push's now plus
	// Config.Timeout. Push never extends a deadline past that.
	Deadline time.Time
	// Owner is the caller's handle for the request (the gateway's waiter, the simulator's
	// request); the Queue never reads it.
	Owner any

	// Enqueued is when Push queued the entry.
	Enqueued time.Time

	start      float64 // start tag of start-time fair queueing, set when it heads its tenant's FIFO
	band       *band
	tq         *tenantQueue
	tprev      *Entry // the tenant's FIFO
	tnext      *Entry
	bprev      *Entry // the band's arrival order
	bnext      *Entry
	heapIdx    int // position in the deadline heap; -1 when not queued
	queued     bool
	shortBound bool // Deadline came from the caller, before Config.Timeout
}

// Queued reports whether e is in a queue.
func (e *Entry) Queued() bool { return e.queued }

// Errors Push returns.
var (
	// ErrFull: the queue holds Config.MaxRequests entries.
	ErrFull = errors.New("flow: the queue is full")
	// ErrBytes: the entry's bytes would pass Config.MaxBytes.
	ErrBytes = errors.New("flow: the queue's bytes are at their bound")
	// ErrQueued: the entry is already in a queue.
	ErrQueued = errors.New("flow: the entry is already queued")
)

// tenantQueue is one tenant's FIFO within one band.
type tenantQueue struct {
	name       string
	head, tail *Entry
	lastFinish float64 // finish tag of its last served entry: what its next head starts from
	active     bool    // in band.tenants (it has entries)
}

// band holds the entries of one priority.
type band struct {
	priority   int
	vtime      float64 // start tag of the entry last served
	head, tail *Entry  // arrival order: head is the oldest
	tenants    []*tenantQueue
	byName     map[string]*tenantQueue
	n          int
}

// Queue is one model's bounded queue: strict priority bands with aging, and within a band
// start-time fair queueing across tenants. It is not safe for concurrent use: the gateway holds
// its own lock around it; the simulator is single-threaded.
type Queue struct {
	cfg       Config
	bands     []*band // by priority, highest first
	deadlines deadlineHeap
	n         int
	bytes     int64
	// credit allows a priority inversion by aging when it reaches 1; each dispatch in priority
	// order adds Config.AgedShare.
	credit float64
}

// NewQueue returns an empty queue bounded by c (after defaults).
func NewQueue(c Config) *Queue { return &Queue{cfg: c.WithDefaults()} }

// Len returns the number of queued entries.
func (q *Queue) Len() int { return q.n }

// Bytes returns the queued entries' bytes.
func (q *Queue) Bytes() int64 { return q.bytes }

// Push queues e at now, or returns ErrFull, ErrBytes or ErrQueued and leaves e out.
func (q *Queue) Push(e *Entry, now time.Time) error {
	switch {
	case e.queued:
		return ErrQueued
	case q.n >= q.cfg.MaxRequests:
		return ErrFull
	case e.Bytes > q.cfg.MaxBytes-q.bytes:
		return ErrBytes
	}
	e.Priority = ClampPriority(e.Priority)
	e.Enqueued = now
	bound := now.Add(q.cfg.Timeout)
	e.shortBound = !e.Deadline.IsZero() && e.Deadline.Before(bound)
	if !e.shortBound {
		e.Deadline = bound
	}
	b := q.band(e.Priority)
	tq := b.byName[e.Tenant]
	if tq == nil {
		b.sweep()
		tq = &tenantQueue{name: e.Tenant, lastFinish: b.vtime}
		b.byName[e.Tenant] = tq
	}
	if !tq.active {
		tq.active = true
		b.tenants = append(b.tenants, tq)
	}
	e.band, e.tq, e.queued = b, tq, true
	e.tprev, e.tnext = tq.tail, nil
	if tq.tail != nil {
		tq.tail.tnext = e
	} else {
		tq.head = e
		e.start = max(b.vtime, tq.lastFinish)
	}
	tq.tail = e
	e.bprev, e.bnext = b.tail, nil
	if b.tail != nil {
		b.tail.bnext = e
	} else {
		b.head = e
	}
	b.tail = e
	b.n++
	q.n++
	q.bytes += e.Bytes
	q.heapPush(e)
	return nil
}

// band returns the band of priority p, creating it in order.
func (q *Queue) band(p int) *band {
	i := 0
	for ; i < len(q.bands); i++ {
		if q.bands[i].priority == p {
			return q.bands[i]
		}
		if q.bands[i].priority < p {
			break
		}
	}
	b := &band{priority: p, byName: map[string]*tenantQueue{}}
	q.bands = append(q.bands, nil)
	copy(q.bands[i+1:], q.bands[i:])
	q.bands[i] = b
	return b
}

// sweep forgets the idle tenants whose service the band's virtual time has passed, once they
// outnumber the active ones (plus a margin): an idle tenant is kept only while its last finish
// tag is ahead, so that it cannot come back ahead of its share.
func (b *band) sweep() {
	if len(b.byName) < 2*len(b.tenants)+64 {
		return
	}
	for name, tq := range b.byName {
		if !tq.active && tq.lastFinish <= b.vtime {
			delete(b.byName, name)
		}
	}
}

// Peek returns the entry Pop would return at now, or nil when the queue is empty.
func (q *Queue) Peek(now time.Time) *Entry {
	b, _ := q.pickBand(now)
	if b == nil {
		return nil
	}
	return pickTenant(b).head
}

// Pop removes and returns the entry to dispatch next at now, or nil when the queue is empty: the
// band with the highest effective priority (its priority plus its oldest entry's wait in units
// of Config.Aging; ties to the higher priority) — but a lower band goes before a higher one that
// has requests at most Config.AgedShare of the time — and within it the tenant whose head entry
// has the smallest start tag (ties to the tenant queued first).
func (q *Queue) Pop(now time.Time) *Entry {
	b, aged := q.pickBand(now)
	if b == nil {
		return nil
	}
	if aged {
		q.credit--
	} else {
		q.credit = min(q.credit+q.cfg.AgedShare, 1)
	}
	e := pickTenant(b).head
	b.vtime = max(b.vtime, e.start)
	w := e.Weight
	if !(w > 0) {
		w = 1
	}
	e.tq.lastFinish = e.start + max(e.Cost, 1)/w // only a served entry is charged
	q.Remove(e)
	return e
}

// pickBand returns the band to serve at now: the highest non-empty band, unless aging makes a
// lower one win and the aging credit allows a priority inversion. It reports whether it chose by
// aging.
func (q *Queue) pickBand(now time.Time) (*band, bool) {
	var top, best *band
	var bestEff float64
	for _, b := range q.bands {
		if b.n == 0 {
			continue
		}
		if top == nil {
			top = b
		}
		eff := float64(b.priority)
		if q.cfg.Aging > 0 {
			eff += float64(now.Sub(b.head.Enqueued)) / float64(q.cfg.Aging)
		}
		if best == nil || eff > bestEff {
			best, bestEff = b, eff
		}
	}
	if best != top && q.credit < 1 {
		return top, false
	}
	return best, best != top
}

func pickTenant(b *band) *tenantQueue {
	var best *tenantQueue
	for _, tq := range b.tenants {
		if best == nil || tq.head.start < best.head.start {
			best = tq
		}
	}
	return best
}

// Remove takes e out of the queue (a cancel, a timeout, a dispatch); it reports false when e was
// not queued.
func (q *Queue) Remove(e *Entry) bool {
	if !e.queued {
		return false
	}
	b, tq := e.band, e.tq
	if e.tprev != nil {
		e.tprev.tnext = e.tnext
	} else {
		tq.head = e.tnext
	}
	if e.tnext != nil {
		e.tnext.tprev = e.tprev
	} else {
		tq.tail = e.tprev
	}
	if e.tprev == nil && tq.head != nil {
		// A new head: it starts where its tenant's service left off. A request that left
		// unserved (a cancel, a timeout) charged nothing.
		tq.head.start = max(b.vtime, tq.lastFinish)
	}
	if tq.head == nil {
		tq.active = false
		for i, t := range b.tenants {
			if t == tq {
				b.tenants = append(b.tenants[:i], b.tenants[i+1:]...)
				break
			}
		}
		if tq.lastFinish <= b.vtime {
			delete(b.byName, tq.name) // it is owed nothing: forget it
		}
	}
	if e.bprev != nil {
		e.bprev.bnext = e.bnext
	} else {
		b.head = e.bnext
	}
	if e.bnext != nil {
		e.bnext.bprev = e.bprev
	} else {
		b.tail = e.bprev
	}
	b.n--
	q.n--
	q.bytes -= e.Bytes
	q.heapRemove(e.heapIdx)
	e.band, e.tq, e.tprev, e.tnext, e.bprev, e.bnext, e.queued = nil, nil, nil, nil, nil, nil, false
	return true
}

// NextDeadline returns the earliest deadline of a queued entry; ok false when the queue is empty.
func (q *Queue) NextDeadline() (at time.Time, ok bool) {
	if len(q.deadlines) == 0 {
		return time.Time{}, false
	}
	return q.deadlines[0].Deadline, true
}

// Expire removes the entries whose deadline is at or before now and appends them to out, earliest
// first.
func (q *Queue) Expire(now time.Time, out []*Entry) []*Entry {
	for len(q.deadlines) > 0 && !q.deadlines[0].Deadline.After(now) {
		e := q.deadlines[0]
		q.Remove(e)
		out = append(out, e)
	}
	return out
}

// Each calls f for every queued entry, in no set order, until f returns false.
func (q *Queue) Each(f func(*Entry) bool) {
	for _, e := range q.deadlines {
		if !f(e) {
			return
		}
	}
}

// ShortDeadline reports whether e's deadline came from the request (its TTFT SLO) rather than
// Config.Timeout.
func (e *Entry) ShortDeadline() bool { return e.shortBound }

// deadlineHeap is the queue's entries as a container/heap min-heap on Deadline (ties in push
// order not guaranteed); each entry keeps its index for Remove.
type deadlineHeap []*Entry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].Deadline.Before(h[j].Deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}

// Push appends x (an *Entry); use heap.Push.
func (h *deadlineHeap) Push(x any) {
	e := x.(*Entry)
	e.heapIdx = len(*h)
	*h = append(*h, e)
}

// Pop removes the last entry; use heap.Pop or heap.Remove.
func (h *deadlineHeap) Pop() any {
	old := *h
	n := len(old) - 1
	e := old[n]
	old[n] = nil // hold no entry past the end
	e.heapIdx = -1
	*h = old[:n]
	return e
}

func (q *Queue) heapPush(e *Entry) { heap.Push(&q.deadlines, e) }

func (q *Queue) heapRemove(i int) { heap.Remove(&q.deadlines, i) }
