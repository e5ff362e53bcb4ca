package radix

import (
	"maps"
	"slices"
	"testing"
	"unicode/utf8"
)

// model is the naive reference: per tenant, every prefix (cut on character boundaries) of every
// text recorded for it, with the stamp of its last access. A tenant's size is the number of
// distinct prefixes it holds, which is the number of characters a trie of its texts holds.
type model struct {
	held map[string]map[string]int64
}

func newModel() *model { return &model{held: map[string]map[string]int64{}} }

// prefixes returns the non-empty character-boundary prefixes of s, shortest first.
func prefixes(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
		out = append(out, s[:i])
	}
	return out
}

func (m *model) insert(text, tenant string, stamp int64) {
	if text == "" {
		return
	}
	h := m.held[tenant]
	if h == nil {
		h = map[string]int64{}
		m.held[tenant] = h
	}
	for _, p := range prefixes(text) {
		h[p] = max(h[p], stamp)
	}
}

func (m *model) lookup(text string) (int, []string) {
	ps := prefixes(text)
	for i := len(ps) - 1; i >= 0; i-- {
		var ts []string
		for name, h := range m.held {
			if _, ok := h[ps[i]]; ok {
				ts = append(ts, name)
			}
		}
		if len(ts) > 0 {
			slices.Sort(ts)
			return i + 1, ts
		}
	}
	return 0, nil
}

// opening returns the bytes of the longest prefix of text that two or more tenants hold.
func (m *model) opening(text string) int {
	ps := prefixes(text)
	for i := len(ps) - 1; i >= 0; i-- {
		n := 0
		for _, h := range m.held {
			if _, ok := h[ps[i]]; ok {
				n++
			}
		}
		if n >= 2 {
			return len(ps[i])
		}
	}
	return 0
}

// holders returns the tenants that hold more than ratio of text: those holding its prefix of
// int(ratio × characters) + 1 characters.
func (m *model) holders(text string, ratio float64) []string {
	ps := prefixes(text)
	need := int(ratio*float64(len(ps))) + 1
	if need > len(ps) {
		return nil
	}
	var ts []string
	for name, h := range m.held {
		if _, ok := h[ps[need-1]]; ok {
			ts = append(ts, name)
		}
	}
	slices.Sort(ts)
	return ts
}

// dump returns, per tenant, every prefix the tree records for it with its stamp. It walks the
// tree without regard to concurrency: call it only when the tree is quiescent.
func dump(t *Tree) map[string]map[string]int64 {
	tab := t.tenants.Load()
	out := map[string]map[string]int64{}
	var rec func(n *node, path string)
	rec = func(n *node, path string) {
		full := path + n.edge
		for _, e := range n.tenants {
			tn := tab.byIdx[e.idx]
			if tn.retired.Load() {
				continue
			}
			if out[tn.name] == nil {
				out[tn.name] = map[string]int64{}
			}
			for _, p := range prefixes(n.edge) {
				out[tn.name][path+p] = e.stamp
			}
		}
		for _, c := range n.children {
			rec(c, full)
		}
	}
	rec(t.root, "")
	return out
}

// checkStructure verifies the tree's invariants: children sorted by distinct keys, keys and
// character counts matching edges, parent pointers, non-empty edges on whole characters, no dead
// node linked, and each tenant's size equal to the characters of the nodes recording it.
func checkStructure(t testing.TB, tr *Tree) {
	t.Helper()
	sizes := map[string]int64{}
	tab := tr.tenants.Load()
	var rec func(n *node)
	rec = func(n *node) {
		if len(n.keys) != len(n.children) {
			t.Fatalf("node %q: %d keys for %d children", n.edge, len(n.keys), len(n.children))
		}
		for i, c := range n.children {
			if n.keys[i] != c.key {
				t.Fatalf("node %q: keys out of step with children", n.edge)
			}
			if c.dead {
				t.Fatalf("dead node %q still linked", c.edge)
			}
			if c.parent.Load() != n {
				t.Fatalf("node %q: wrong parent", c.edge)
			}
			if c.edge == "" || c.key != unitKey(c.edge) || int(c.chars) != charCount(c.edge) {
				t.Fatalf("node %q: key %d chars %d", c.edge, c.key, c.chars)
			}
			if i > 0 && n.children[i-1].key >= c.key {
				t.Fatalf("children of %q not sorted by distinct key", n.edge)
			}
			seen := map[uint32]bool{}
			for _, e := range c.tenants {
				if seen[e.idx] {
					t.Fatalf("node %q: tenant %d twice", c.edge, e.idx)
				}
				seen[e.idx] = true
				if tn := tab.byIdx[e.idx]; !tn.retired.Load() {
					sizes[tn.name] += int64(c.chars)
				}
			}
			rec(c)
		}
	}
	rec(tr.root)
	for name, tn := range tab.byName {
		if got := tn.size.Load(); got != sizes[name] {
			t.Fatalf("tenant %s: size %d, nodes hold %d", name, got, sizes[name])
		}
	}
}

// checkEviction verifies one tenant's eviction against its held set before and after.
func checkEviction(t testing.TB, tenant string, before, after map[string]int64, maxChars int64) {
	t.Helper()
	for p, s := range after {
		if bs, ok := before[p]; !ok || bs != s {
			t.Fatalf("%s: eviction invented %q (stamp %d, before %d, %v)", tenant, p, s, bs, ok)
		}
		ps := prefixes(p)
		for _, q := range ps[:len(ps)-1] {
			if _, ok := after[q]; !ok {
				t.Fatalf("%s: kept %q but not its prefix %q", tenant, p, q)
			}
		}
	}
	if int64(len(before)) <= maxChars {
		if !maps.Equal(before, after) {
			t.Fatalf("%s: evicted %d chars while within budget", tenant, len(before)-len(after))
		}
		return
	}
	if int64(len(after)) > maxChars {
		t.Fatalf("%s: %d chars after eviction, budget %d", tenant, len(after), maxChars)
	}
	newestEvicted, oldestKept := int64(-1<<63), int64(1<<63-1)
	for p, s := range before {
		if _, ok := after[p]; ok {
			oldestKept = min(oldestKept, s)
		} else {
			newestEvicted = max(newestEvicted, s)
		}
	}
	if newestEvicted > oldestKept {
		t.Fatalf("%s: evicted text stamped %d but kept text stamped %d", tenant, newestEvicted, oldestKept)
	}
}
