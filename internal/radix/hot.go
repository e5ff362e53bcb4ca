package radix

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// HotOptions bounds what Hot returns. The zero value asks for nothing (Limit 0).
type HotOptions struct {
	// Limit is the most prefixes returned; 0 returns none.
	Limit int
	// Exclude is a tenant whose prefixes do not count: a prefix it already holds is skipped, and
	// a prefix held by it alone is not offered. "" excludes nobody.
	Exclude string
	// MinHits is the fewest recordings that must have run through a prefix (a prefix sent once
	// was not reused); values below 2 mean 2.
	MinHits int
	// MinChars is the shortest prefix worth returning, in characters; 0 means 1.
	MinChars int
	// MaxChars cuts a longer prefix to its first MaxChars characters; 0 means no cut.
	MaxChars int
	// MaxBytes skips prefixes longer than MaxBytes bytes (before any cut), so that Limit counts
	// only those the caller can use; 0 skips none.
	MaxBytes int
	// Since skips prefixes no tenant has touched since then; the zero time skips none.
	Since time.Time
}

// HotPrefix is one prefix Hot found.
type HotPrefix struct {
	// Text is the prefix, from the start of the recorded texts; cut to MaxChars.
	Text string
	// Chars is the prefix's length in characters before any cut.
	Chars int
	// Hits is how many recordings ran through the whole prefix (while the tree held it).
	Hits int
	// Holders is how many tenants other than Exclude hold it.
	Holders int
	// Last is when a tenant last touched it.
	Last time.Time
}

// hotNode is one node seen by Hot's walk: what ranking needs, copied under the node's lock.
type hotNode struct {
	parent   int32 // index in the walk's slice; -1 for a child of the root
	edge     string
	chars    int // characters from the root to the end of the edge
	bytes    int // and bytes
	hits     uint32
	maxChild uint32 // the most hits of one child
	holders  int
	excluded bool // Exclude holds it
	last     int64
}

// Hot returns up to opts.Limit of the prefixes most worth copying to a tenant that holds
// nothing yet (a worker that just joined): the prefixes with the most recorded traffic, by
// characters times hits — the prefill a holder of the prefix saves — most first.
//
// A prefix is offered where reuse stops growing longer: at a node through which at least
// MinHits recordings ran and to no single child of which more than half of them continued (a
// longer prefix carrying most of the same traffic is the better one to copy). Shared openings
// that every prompt starts with are thus offered only when nothing longer is reused, and a
// prefix that is the start of another one offered is dropped, since copying the longer copies
// it. Hot walks the whole tree, one node lock at a time, so routing goes on while it runs; it is
// meant for rare events (a worker joining), not per request. The picture is approximate under
// concurrent change, as everything the tree says is.
func (t *Tree) Hot(opts HotOptions) []HotPrefix {
	if opts.Limit <= 0 {
		return nil
	}
	minHits := uint32(max(opts.MinHits, 2))
	minChars := max(opts.MinChars, 1)
	var since int64
	if !opts.Since.IsZero() {
		since = opts.Since.UnixNano()
	}
	nodes := t.hotWalk(opts.Exclude)
	var cands []int32
	for i := range nodes {
		n := &nodes[i]
		if n.hits < minHits || n.excluded || n.holders == 0 || n.chars < minChars || n.last < since ||
			(opts.MaxBytes > 0 && n.bytes > opts.MaxBytes) {
			continue
		}
		if uint64(n.maxChild)*2 > uint64(n.hits) {
			continue // a child carries most of this traffic further
		}
		cands = append(cands, int32(i))
	}
	score := func(i int32) uint64 { return uint64(nodes[i].chars) * uint64(nodes[i].hits) }
	slices.SortFunc(cands, func(a, b int32) int {
		if c := cmp.Compare(score(b), score(a)); c != 0 {
			return c
		}
		if c := cmp.Compare(nodes[b].last, nodes[a].last); c != 0 {
			return c
		}
		return cmp.Compare(a, b) // walk order: deterministic for a given tree
	})
	chosen := map[int32]bool{}
	var picked []int32
	for _, c := range cands {
		if len(picked) == opts.Limit {
			break
		}
		if chosen[c] {
			continue // the start of a prefix already picked
		}
		// Picking c copies every prefix on its path: drop those picked, and never offer them.
		for p := nodes[c].parent; p >= 0; p = nodes[p].parent {
			if chosen[p] {
				picked = slices.DeleteFunc(picked, func(x int32) bool { return x == p })
			}
			chosen[p] = true
		}
		chosen[c] = true
		picked = append(picked, c)
	}
	out := make([]HotPrefix, 0, len(picked))
	for _, i := range picked {
		n := &nodes[i]
		out = append(out, HotPrefix{
			Text: hotText(nodes, i, opts.MaxChars), Chars: n.chars, Hits: int(n.hits),
			Holders: n.holders, Last: time.Unix(0, n.last),
		})
	}
	return out
}

// hotWalk copies every node below the root with its ranking data, parents before children.
func (t *Tree) hotWalk(exclude string) []hotNode {
	var out []hotNode
	tab := t.tenants.Load()
	t.walk(func(n *node, _ int, parent int32) int32 {
		h := hotNode{parent: parent, edge: n.edge, chars: int(n.chars), hits: n.hits}
		h.bytes = len(n.edge)
		if parent >= 0 {
			h.chars += out[parent].chars
			h.bytes += out[parent].bytes
		}
		for _, e := range n.tenants {
			tn := tabTenant(t, &tab, e.idx)
			switch {
			case tn.retired.Load(): // retired since walk purged this node's records
				continue
			case tn.name == exclude:
				h.excluded = true
			default:
				h.holders++
			}
			h.last = max(h.last, e.stamp)
		}
		out = append(out, h)
		if parent >= 0 {
			p := &out[parent]
			p.maxChild = max(p.maxChild, h.hits)
		}
		return int32(len(out) - 1)
	})
	return out
}

// hotText rebuilds the text from the root to the end of node i, cut to maxChars characters
// when maxChars > 0.
func hotText(nodes []hotNode, i int32, maxChars int) string {
	var edges []string
	for ; i >= 0; i = nodes[i].parent {
		edges = append(edges, nodes[i].edge)
	}
	slices.Reverse(edges)
	s := strings.Join(edges, "")
	if maxChars > 0 && charCount(s) > maxChars {
		s = prefixChars(s, maxChars)
	}
	return s
}

// prefixChars returns the first n characters of s (all of s if it is shorter).
func prefixChars(s string, n int) string {
	for i := range s { // i walks rune starts; an invalid byte is one character, as charCount says
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
