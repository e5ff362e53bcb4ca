package radix

import (
	"cmp"
	"maps"
	"slices"
)

// candidate is one (node, tenant) record that eviction may drop.
type candidate struct {
	n     *node
	stamp int64
	depth int // bytes from the root to the end of n's edge
	idx   uint32
}

// Evict trims every tenant that holds more than maxChars characters back to at most maxChars,
// dropping its least recently used text first, drops the records that aged out on their
// tenant's clock (limit.go), and purges the records of removed tenants. It returns the number
// of (node, tenant) records dropped.
//
// Evict never holds more than two node locks, and those only briefly, so routing goes on while it
// runs. It first walks the tree to collect the records of the tenants over budget, then drops them
// oldest first; among equal stamps the deeper goes first, so a tenant's text is trimmed from its
// ends and what it keeps is always a set of whole prefixes. A record touched again since the walk
// is kept.
func (t *Tree) Evict(maxChars int64) int {
	tab := t.tenants.Load()
	over := map[uint32]bool{}
	for _, tn := range tab.byName {
		if tn.size.Load() > maxChars {
			over[tn.idx] = true
		}
	}
	keep := keepAges(tab) // limit.go
	if len(over) == 0 && len(keep) == 0 {
		// Nobody is over budget and no record can have aged out: skip the walk, which over a
		// large tree costs far more than the routing between two passes. Remove purges a
		// tenant's records itself; the only records this skips are those of a Route that raced
		// a Remove, which match nothing (the tenant is retired) and go with the next walk.
		return 0
	}
	var cands []candidate
	dropped := 0
	empty := t.walk(func(n *node, depth int, _ int32) int32 {
		dropped += dropAged(n, tab, keep)
		for _, e := range n.tenants {
			if over[e.idx] {
				cands = append(cands, candidate{n: n, stamp: e.stamp, depth: depth, idx: e.idx})
			}
		}
		return -1
	})
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(a.stamp, b.stamp); c != 0 {
			return c
		}
		return cmp.Compare(b.depth, a.depth)
	})
	for _, c := range cands {
		tn := tab.byIdx[c.idx]
		if tn.size.Load() <= maxChars {
			continue
		}
		if t.drop(c, tn) {
			dropped++
		}
	}
	for _, n := range empty {
		t.prune(n)
	}
	return dropped
}

// drop removes c's record if it is still there and untouched since the walk, and prunes the node
// if that left it empty.
func (t *Tree) drop(c candidate, tn *tenant) bool {
	n := c.n
	n.mu.Lock()
	i := slices.IndexFunc(n.tenants, func(e entry) bool { return e.idx == c.idx })
	if n.dead || i < 0 || n.tenants[i].stamp > c.stamp {
		n.mu.Unlock()
		return false
	}
	n.tenants = slices.Delete(n.tenants, i, i+1)
	tn.size.Add(-int64(n.chars))
	empty := len(n.tenants) == 0 && len(n.children) == 0
	n.mu.Unlock()
	if empty {
		t.prune(n)
	}
	return true
}

// walk visits every node below the root once, parents before children, each under its own
// lock, and purges the records of retired tenants on the way. visit gets the node, the
// characters from the root to the end of its edge, and what visit returned for its parent (-1
// for a child of the root), which is what its children get in turn. It returns the nodes it
// found empty (no tenants, no children).
func (t *Tree) walk(visit func(n *node, depth int, up int32) int32) (empty []*node) {
	type item struct {
		n     *node
		depth int
		up    int32
	}
	t.root.mu.Lock()
	stack := make([]item, 0, len(t.root.children))
	for _, c := range t.root.children {
		stack = append(stack, item{c, 0, -1})
	}
	t.root.mu.Unlock()
	tab := t.tenants.Load()
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := it.n
		n.mu.Lock()
		if n.dead {
			n.mu.Unlock()
			continue
		}
		depth := it.depth + len(n.edge)
		n.tenants = slices.DeleteFunc(n.tenants, func(e entry) bool {
			return tabTenant(t, &tab, e.idx).retired.Load()
		})
		up := int32(-1)
		if visit != nil {
			up = visit(n, depth, it.up)
		}
		for _, c := range n.children {
			stack = append(stack, item{c, depth, up})
		}
		if len(n.tenants) == 0 && len(n.children) == 0 {
			empty = append(empty, n)
		}
		n.mu.Unlock()
	}
	return empty
}

// tabTenant resolves idx, reloading the table if the tenant was added after tab was loaded.
func tabTenant(t *Tree, tab **tenantTable, idx uint32) *tenant {
	if int(idx) >= len((*tab).byIdx) {
		*tab = t.tenants.Load()
	}
	return (*tab).byIdx[idx]
}

// prune unlinks n from its parent if it is still empty, then climbs while parents become empty.
func (t *Tree) prune(n *node) {
	for n != t.root {
		p := n.parent.Load()
		if p == nil {
			return
		}
		p.mu.Lock()
		if n.parent.Load() != p {
			p.mu.Unlock()
			continue
		}
		n.mu.Lock()
		removed := false
		if !n.dead && len(n.tenants) == 0 && len(n.children) == 0 {
			if i, ok := slices.BinarySearch(p.keys, n.key); ok && p.children[i] == n {
				p.children = slices.Delete(p.children, i, i+1)
				p.keys = slices.Delete(p.keys, i, i+1)
				if len(p.children) == 0 {
					p.children, p.keys = nil, nil
				}
			}
			n.dead = true
			removed = true
		}
		n.mu.Unlock()
		next := removed && !p.dead && len(p.tenants) == 0 && len(p.children) == 0
		p.mu.Unlock()
		if !next {
			return
		}
		n = p
	}
}

// Remove drops tenant's records at once: from this call on it matches nothing and its size is
// gone; its records are purged from the nodes before Remove returns. A later Insert for the same
// name starts afresh. Removing an unknown tenant does nothing.
func (t *Tree) Remove(name string) {
	t.tmu.Lock()
	old := t.tenants.Load()
	tn := old.byName[name]
	if tn == nil {
		t.tmu.Unlock()
		return
	}
	tn.retired.Store(true)
	tab := &tenantTable{byName: maps.Clone(old.byName), byIdx: old.byIdx}
	delete(tab.byName, name)
	t.tenants.Store(tab)
	t.tmu.Unlock()
	for _, n := range t.walk(nil) {
		t.prune(n)
	}
}

// Tenants returns the names of the current tenants, sorted.
func (t *Tree) Tenants() []string {
	return slices.Sorted(maps.Keys(t.tenants.Load().byName))
}
