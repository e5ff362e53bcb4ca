package engine

import "time"

// blockID is the index of a cached block in cache.slab; 0 is the LRU sentinel, never a block.
type blockID int32

// block is one cached KV block: a full block of prompt tokens, identified by its chained key.
// A block with ref > 0 is pinned by running requests; a block with ref == 0 sits in the LRU list
// and may be evicted.
type block struct {
	key        uint64
	ref        int32
	prev, next blockID // LRU list links; 0 when pinned
}

// cache is the KV-cache: capacity counted in blocks, split into free blocks, private blocks
// (held by one request, not shareable: partial blocks, decode tokens, blocks being prefilled),
// pinned cached blocks, and evictable cached blocks in least-recently-used order.
//
// Cached blocks live in one slab and refer to each other by index, and the key → block index
// is an open-addressing table, so the cache holds no pointers: the garbage collector never scans
// it and looking a key up costs one or two probes of a flat array (it is the engine's hottest
// lookup: every block of every prompt, at submission and at admission).
type cache struct {
	total int // capacity in blocks
	free  int // unallocated blocks
	// slab holds the cached blocks; slab[0] is the sentinel of the circular LRU list:
	// slab[0].next is the least recently used block.
	slab   []block
	lruLen int
	// spare lists slab slots of evicted blocks, reused before the slab grows.
	spare []blockID
	index table

	// obs, when set, is told of every block that enters or leaves the index, at time at (the
	// engine keeps at current whenever the cache may change).
	obs CacheObserver
	at  time.Duration
}

func newCache(totalBlocks int) *cache {
	return &cache{total: totalBlocks, free: totalBlocks, slab: make([]block, 1, 64)}
}

// cached is the number of cached blocks, pinned or evictable.
func (c *cache) cached() int { return c.index.n }

// supply is how many blocks can be allocated now: free plus evictable.
func (c *cache) supply() int { return c.free + c.lruLen }

// used is the number of blocks held by running requests (pinned or private).
func (c *cache) used() int { return c.total - c.free - c.lruLen }

// match returns the number of leading keys whose blocks are cached, and how many of those are
// evictable (not pinned).
func (c *cache) match(keys []uint64) (n, evictable int) {
	for _, k := range keys {
		id := c.index.get(k)
		if id == 0 {
			break
		}
		if c.slab[id].ref == 0 {
			evictable++
		}
		n++
	}
	return n, evictable
}

// lookup appends to dst the blocks of the leading keys that are cached, as match counts them,
// and returns it with how many of those blocks are evictable. It takes no reference.
func (c *cache) lookup(keys []uint64, dst []blockID) (_ []blockID, evictable int) {
	for _, k := range keys {
		id := c.index.get(k)
		if id == 0 {
			break
		}
		if c.slab[id].ref == 0 {
			evictable++
		}
		dst = append(dst, id)
	}
	return dst, evictable
}

// ref takes a reference on cached block id, taking it off the LRU list if it was evictable.
func (c *cache) ref(id blockID) {
	b := &c.slab[id]
	if b.ref == 0 {
		c.unlink(id)
	}
	b.ref++
}

// unpin drops a reference; the last one makes block id the most recently used evictable block.
func (c *cache) unpin(id blockID) {
	b := &c.slab[id]
	b.ref--
	if b.ref > 0 {
		return
	}
	last := c.slab[0].prev
	b.prev, b.next = last, 0
	c.slab[last].next = id
	c.slab[0].prev = id
	c.lruLen++
}

func (c *cache) unlink(id blockID) {
	b := &c.slab[id]
	c.slab[b.prev].next = b.next
	c.slab[b.next].prev = b.prev
	b.prev, b.next = 0, 0
	c.lruLen--
}

// alloc takes n private blocks, evicting least-recently-used cached blocks as needed. It
// reports false, taking nothing, when supply() < n.
func (c *cache) alloc(n int) bool {
	if n > c.supply() {
		return false
	}
	for c.free < n {
		c.evictOldest()
		c.free++
	}
	c.free -= n
	return true
}

// evictOldest drops the least recently used evictable block, which must exist.
func (c *cache) evictOldest() {
	id := c.slab[0].next
	c.unlink(id)
	c.index.remove(c.slab[id].key)
	c.spare = append(c.spare, id)
	if c.obs != nil {
		c.obs.BlockRemoved(c.at, c.slab[id].key)
	}
}

// release returns n private blocks.
func (c *cache) release(n int) { c.free += n }

// publish turns one private block just filled with the prompt block of key into a cached block
// pinned once, and reports whether the key is new to the cache. When another request published
// the same key first, the private block is returned and the existing block pinned instead.
func (c *cache) publish(key uint64) (blockID, bool) {
	slot, found := c.index.find(key)
	if found {
		c.free++
		id := c.index.slots[slot].id
		c.ref(id)
		return id, false
	}
	var id blockID
	if n := len(c.spare); n > 0 {
		id, c.spare = c.spare[n-1], c.spare[:n-1]
	} else {
		id = blockID(len(c.slab))
		c.slab = append(c.slab, block{})
	}
	c.slab[id] = block{key: key, ref: 1}
	c.index.insertAt(slot, key, id)
	return id, true
}

// flush drops every evictable block and reports how many it dropped. Pinned blocks stay: they
// belong to running requests.
func (c *cache) flush() int {
	n := c.lruLen
	obs := c.obs
	if obs != nil && n == c.index.n {
		// Nothing is pinned: the whole cache goes, which one event says.
		c.obs = nil
		defer func() { c.obs = obs; obs.CacheCleared(c.at) }()
	}
	for c.lruLen > 0 {
		c.evictOldest()
		c.free++
	}
	return n
}
