// Package lru is the gateway's one bounded least-recently-used map: a map whose entries each
// have a cost (1 for a count bound, a size for a byte or token bound), kept under a total, the
// least recently used dropped first.
package lru

// Cache maps keys to values, bounded by the sum of the entries' costs. The zero value is not
// usable: create it with New. Not safe for concurrent use: its owner holds its own lock (every
// user already has one around the state the cache belongs to).
type Cache[K comparable, V any] struct {
	max, cost int
	byKey     map[K]*entry[K, V]
	root      entry[K, V] // sentinel of the recency ring: root.next is the most recent
}

type entry[K comparable, V any] struct {
	key        K
	val        V
	cost       int
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

// Add sets k to v at cost (at least 0), the most recently used, then drops the least recently
// used entries while the costs sum past the bound (k itself last, when its cost alone is past
// it). It returns how many entries it dropped.
func (c *Cache[K, V]) Add(k K, v V, cost int) (dropped int) {
	cost = max(cost, 0)
	if e := c.byKey[k]; e != nil {
		c.unlink(e)
		c.cost += cost - e.cost
		e.val, e.cost = v, cost
		c.front(e)
	} else {
		e = &entry[K, V]{key: k, val: v, cost: cost}
		c.byKey[k] = e
		c.cost += cost
		c.front(e)
	}
	for c.cost > c.max && c.root.prev != &c.root {
		c.drop(c.root.prev)
		dropped++
	}
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
