// Package lru is the gateway's one bounded least-recently-used map: a map whose entries each
// have a cost (1 for a count bound, a size for a byte or token bound), kept under a total, the
// least recently used dropped first; an entry may also carry a deadline past which it is gone
// (a TTL, fixed or renewed by its owner on use).
package lru

import "time"

// Cache maps keys to values, bounded by the sum of the entries' costs. The zero value is not
// usable: create it with New. Not safe for concurrent use: its owner holds its own lock (every
// user already has one around the state the cache belongs to).
//
// Deadlines are the owner's: the cache reads no clock, and every call that may find an entry
// expired is given now. An entry is expired once now is after its deadline; the zero deadline
// never expires. Get, Peek, Add and the bound ignore deadlines (an expired entry stays until
// GetLive, Expire, Remove or the bound drops it).
type Cache[K comparable, V any] struct {
	max, cost int
	byKey     map[K]*entry[K, V]
	root      entry[K, V] // sentinel of the recency ring: root.next is the most recent
	expired   uint64      // entries dropped by GetLive and Expire
	evicted   uint64      // entries dropped by the bound
}

type entry[K comparable, V any] struct {
	key        K
	val        V
	cost       int
	deadline   time.Time
	prev, next *entry[K, V]
}

// New returns an empty cache whose entries' costs sum to at most maxCost.
func New[K comparable, V any](maxCost int) *Cache[K, V] {
	c := &Cache[K, V]{max: maxCost, byKey: map[K]*entry[K, V]{}}
	c.root.prev, c.root.next = &c.root, &c.root
	return c
}

// Len returns the number of entries.
func (c *Cache[K, V]) Len() int { return len(c.byKey) }

// Cost returns the sum of the entries' costs.
func (c *Cache[K, V]) Cost() int { return c.cost }

// Drops returns how many entries left because they expired (GetLive, Expire) and how many the
// bound pushed out (Add, AddUntil), over the cache's life. Remove counts in neither.
func (c *Cache[K, V]) Drops() (expired, evicted uint64) { return c.expired, c.evicted }

// Get returns the value of k and marks it the most recently used.
func (c *Cache[K, V]) Get(k K) (v V, ok bool) {
	e := c.byKey[k]
	if e == nil {
		return v, false
	}
	c.unlink(e)
	c.front(e)
	return e.val, true
}

// GetLive is Get for an entry not expired at now; an expired one is dropped.
func (c *Cache[K, V]) GetLive(k K, now time.Time) (v V, ok bool) {
	e := c.byKey[k]
	if e == nil {
		return v, false
	}
	if e.expiredAt(now) {
		c.drop(e)
		c.expired++
		return v, false
	}
	c.unlink(e)
	c.front(e)
	return e.val, true
}

// Peek returns the value and deadline of k, expired or not, without marking it.
func (c *Cache[K, V]) Peek(k K) (v V, deadline time.Time, ok bool) {
	if e := c.byKey[k]; e != nil {
		return e.val, e.deadline, true
	}
	return v, deadline, false
}

// Add sets k to v at cost, never expiring; see AddUntil.
func (c *Cache[K, V]) Add(k K, v V, cost int) (dropped int) {
	return c.AddUntil(k, v, cost, time.Time{})
}

// AddUntil sets k to v at cost (at least 0) until deadline (zero: never), the most recently
// used, then drops the least recently used entries while the costs sum past the bound (k itself
// last, when its cost alone is past it). It returns how many entries it dropped.
func (c *Cache[K, V]) AddUntil(k K, v V, cost int, deadline time.Time) (dropped int) {
	cost = max(cost, 0)
	if e := c.byKey[k]; e != nil {
		c.unlink(e)
		c.cost += cost - e.cost
		e.val, e.cost, e.deadline = v, cost, deadline
		c.front(e)
	} else {
		e = &entry[K, V]{key: k, val: v, cost: cost, deadline: deadline}
		c.byKey[k] = e
		c.cost += cost
		c.front(e)
	}
	for c.cost > c.max && c.root.prev != &c.root {
		c.drop(c.root.prev)
		dropped++
	}
	c.evicted += uint64(dropped)
	return dropped
}

// Remove drops k; it reports whether k was there.
func (c *Cache[K, V]) Remove(k K) bool {
	e := c.byKey[k]
	if e == nil {
		return false
	}
	c.drop(e)
	return true
}

// Oldest returns the least recently used entry, without marking it; ok false when empty.
func (c *Cache[K, V]) Oldest() (k K, v V, ok bool) {
	if e := c.root.prev; e != &c.root {
		return e.key, e.val, true
	}
	return k, v, false
}

// Expire drops the entries expired at now from the least recently used end, stopping at the
// first that is not, or after limit of them (limit < 0: no limit), and returns how many it
// dropped. Where every use renews an entry's deadline by one TTL, recency order is deadline
// order and Expire(now, -1) drops every expired entry; otherwise it drops the cold ones, the
// likeliest to have expired, without walking the whole cache.
func (c *Cache[K, V]) Expire(now time.Time, limit int) (dropped int) {
	for e := c.root.prev; e != &c.root && dropped != limit && e.expiredAt(now); e = c.root.prev {
		c.drop(e)
		dropped++
	}
	c.expired += uint64(dropped)
	return dropped
}

func (e *entry[K, V]) expiredAt(now time.Time) bool {
	return !e.deadline.IsZero() && now.After(e.deadline)
}

func (c *Cache[K, V]) drop(e *entry[K, V]) {
	c.unlink(e)
	delete(c.byKey, e.key)
	c.cost -= e.cost
	e.prev, e.next = nil, nil // hold nothing from the ring
}

func (c *Cache[K, V]) unlink(e *entry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *Cache[K, V]) front(e *entry[K, V]) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}
