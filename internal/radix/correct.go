package radix

import (
	"slices"
	"time"
)

// CharCount returns the number of characters in s as the tree counts them (text.go).
func CharCount(s string) int { return charCount(s) }

// Correct is what an engine's answer teaches the tree about tenant: the engine held only the
// first keep characters of text when the request was served, so every record of tenant that
// hangs below that point off text's own path, stamped before before, is gone (an engine's prefix
// cache cannot reuse a block whose prefix it evicted). text's own path stays: serving the request
// put it back. Records stamped since before are newer than the answer's evidence and stay. It
// returns the (node, tenant) records dropped. Correct holds at most two node locks at a time.
func (t *Tree) Correct(text, tenant string, keep int, before time.Time) int {
	tn := t.tenants.Load().byName[tenant]
	if tn == nil || keep < 0 {
		return 0
	}
	cut := before.UnixNano()
	// Descend text's path, collecting the children off it of every node that ends at or past
	// keep characters.
	var off []*node
	n := t.root
	n.mu.Lock()
	pos, depth := 0, 0
	for {
		var next *node
		if pos < len(text) {
			next = n.child(unitKey(text[pos:]))
		}
		if depth >= keep {
			for _, c := range n.children {
				if c != next {
					off = append(off, c)
				}
			}
		}
		if next == nil {
			break
		}
		next.mu.Lock()
		n.mu.Unlock()
		n = next
		k := commonPrefix(n.edge, text[pos:])
		if k < len(n.edge) {
			break // text ends or diverges inside this edge: nothing of it is below
		}
		pos += k
		depth += int(n.chars)
	}
	n.mu.Unlock()
	dropped := 0
	for len(off) > 0 {
		c := off[len(off)-1]
		off = off[:len(off)-1]
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			continue
		}
		i := slices.IndexFunc(c.tenants, func(e entry) bool { return e.idx == tn.idx })
		if i < 0 {
			c.mu.Unlock()
			continue // a node's tenants include every tenant below it: nothing of tn there
		}
		if c.tenants[i].stamp < cut {
			c.tenants = slices.Delete(c.tenants, i, i+1)
			tn.size.Add(-int64(c.chars))
			dropped++
		}
		off = append(off, c.children...)
		empty := len(c.tenants) == 0 && len(c.children) == 0
		c.mu.Unlock()
		if empty {
			t.prune(c)
		}
	}
	return dropped
}
