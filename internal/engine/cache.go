package engine

// block is one cached KV block: a full block of prompt tokens, identified by its chained key.
// A block with ref > 0 is pinned by running requests; a block with ref == 0 sits in the LRU list
// and may be evicted.
type block struct {
	key        uint64
	ref        int32
	prev, next *block // LRU list links; nil when pinned
}

// cache is the KV-cache: capacity counted in blocks, split into free blocks, private blocks
// (held by one request, not shareable: partial blocks, decode tokens, blocks being prefilled),
// pinned cached blocks, and evictable cached blocks in least-recently-used order.
type cache struct {
	total  int // capacity in blocks
	free   int // unallocated blocks
	blocks map[uint64]*block
	// lru is a sentinel of a circular list: lru.next is the least recently used block.
	lru    block
	lruLen int
	// spare recycles evicted block structs to keep the fast path free of allocation.
	spare []*block
}

func newCache(totalBlocks int) *cache {
	c := &cache{total: totalBlocks, free: totalBlocks, blocks: make(map[uint64]*block)}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// supply is how many blocks can be allocated now: free plus evictable.
func (c *cache) supply() int { return c.free + c.lruLen }

// used is the number of blocks held by running requests (pinned or private).
func (c *cache) used() int { return c.total - c.free - c.lruLen }

// match returns the number of leading keys whose blocks are cached, and how many of those are
// evictable (not pinned).
func (c *cache) match(keys []uint64) (n, evictable int) {
	for _, k := range keys {
		b, ok := c.blocks[k]
		if !ok {
			break
		}
		if b.ref == 0 {
			evictable++
		}
		n++
	}
	return n, evictable
}

// pin takes a reference on the cached block of key, which must exist.
func (c *cache) pin(key uint64) *block {
	b := c.blocks[key]
	if b.ref == 0 {
		c.unlink(b)
	}
	b.ref++
	return b
}

// unpin drops a reference; the last one makes b the most recently used evictable block.
func (c *cache) unpin(b *block) {
	b.ref--
	if b.ref > 0 {
		return
	}
	b.prev, b.next = c.lru.prev, &c.lru
	c.lru.prev.next = b
	c.lru.prev = b
	c.lruLen++
}

func (c *cache) unlink(b *block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	c.lruLen--
}

// alloc takes n private blocks, evicting least-recently-used cached blocks as needed. It
// reports false, taking nothing, when supply() < n.
func (c *cache) alloc(n int) bool {
	if n > c.supply() {
		return false
	}
	for c.free < n {
		b := c.lru.next
		c.unlink(b)
		delete(c.blocks, b.key)
		c.spare = append(c.spare, b)
		c.free++
	}
	c.free -= n
	return true
}

// release returns n private blocks.
func (c *cache) release(n int) { c.free += n }

// publish turns one private block just filled with the prompt block of key into a cached block
// pinned once. When another request published the same key first, the private block is
// returned and the existing block pinned instead.
func (c *cache) publish(key uint64) *block {
	if _, ok := c.blocks[key]; ok {
		c.free++
		return c.pin(key)
	}
	var b *block
	if n := len(c.spare); n > 0 {
		b, c.spare = c.spare[n-1], c.spare[:n-1]
		*b = block{}
	} else {
		b = new(block)
	}
	b.key, b.ref = key, 1
	c.blocks[key] = b
	return b
}

// flush drops every evictable block and reports how many it dropped. Pinned blocks stay: they
// belong to running requests.
func (c *cache) flush() int {
	n := c.lruLen
	for c.lruLen > 0 {
		b := c.lru.next
		c.unlink(b)
		delete(c.blocks, b.key)
		c.free++
	}
	c.spare = c.spare[:0]
	return n
}
