// Package radix is the concurrent prefix tree behind cache-aware routing: an approximate picture,
// per model, of which worker ("tenant") was sent which prompt text. Each node holds an edge of
// text and the tenants whose inserted text runs through it, each with the time it last did.
//
// One call, Route, serves one request: it descends once to the longest stored prefix of the
// text, lets the caller choose a tenant from what it found, and records the text for that tenant
// in the same descent. Every tenant's size (characters held) is tracked; Evict trims tenants to a
// budget oldest-first, and Remove drops a tenant at once.
//
// Concurrency: every node has its own mutex. A descent holds at most two adjacent locks at a time
// (hand over hand, parent before child), so requests whose texts diverge early share only the
// root's lock, and only for a child lookup. After the choice, the tenant's stamps on the ancestors
// of the deepest node are refreshed bottom-up, one lock at a time. Under concurrent splits a stamp
// can land one node off; that only makes the picture approximate (it is a hint, not a cache), and
// never unsound: sizes always equal the characters of the nodes a tenant is recorded on.
//
// Characters, not bytes: see text.go. The package starts no goroutines; the owner calls Evict.
package radix

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Tree is a concurrent radix tree over text with tenants. Create it with New; the zero value is
// not usable. All methods are safe for concurrent use.
type Tree struct {
	now  func() time.Time
	root *node

	// tenants is the current tenant table; writers hold tmu and publish a new table.
	tenants atomic.Pointer[tenantTable]
	tmu     sync.Mutex

	matchPool sync.Pool

	// limited is set once any tenant got a limit (SetLimit): until then a descent skips the
	// per-node visibility checks that limits need.
	limited atomic.Bool
}

// Options configures a Tree.
type Options struct {
	// Now is the clock that stamps accesses for LRU eviction; nil means time.Now. The fleet
	// simulator injects its virtual clock.
	Now func() time.Time
}

// New returns an empty tree.
func New(opts Options) *Tree {
	t := &Tree{now: opts.Now, root: &node{}}
	if t.now == nil {
		t.now = time.Now
	}
	t.tenants.Store(&tenantTable{byName: map[string]*tenant{}})
	t.matchPool.New = func() any { return new(Match) }
	return t
}

// node is one edge of the tree. mu guards every field but parent, which is written only under
// the lock of the node's current parent (so a reader that holds that parent's lock sees it
// stable) and read atomically by the bottom-up stamp walk.
type node struct {
	mu     sync.Mutex
	parent atomic.Pointer[node]
	// edge is the text on the edge into this node; "" only for the root.
	edge string
	// key is unitKey(edge); children are kept sorted by it, and keys[i] is children[i].key, kept
	// apart so that a lookup binary-searches one small array instead of touching every child.
	key int32
	// chars is the number of characters in edge.
	chars int32
	dead  bool
	// hits counts the recordings whose text runs through the whole of this node (saturating):
	// how often its prefix was sent, which Hot ranks by.
	hits     uint32
	children []*node
	keys     []int32
	tenants  []entry
}

// entry records that a tenant holds the text down to this node, and when it last did: stamp on
// the tree's clock, seq on the tenant's own (its clock's low 32 bits then; limit.go).
type entry struct {
	idx   uint32
	seq   uint32
	stamp int64
}

// tenant is one tenant's identity and accounting. A removed tenant is retired: its entries are
// ignored at once and purged lazily, and the name gets a fresh tenant if it comes back.
type tenant struct {
	name    string
	idx     uint32
	size    atomic.Int64
	retired atomic.Bool
	// clock and limit are the tenant's own clock and the age on it past which its records are
	// hidden (0: never); limit.go.
	clock, limit atomic.Int64
}

// tenantTable is an immutable index of the tenants; byIdx keeps retired tenants (nil once purged
// is not needed: retired ones are few) so that stale entries resolve.
type tenantTable struct {
	byName map[string]*tenant
	byIdx  []*tenant
}

// Match is what the descent found, handed to the chooser of Route. It is valid only during the
// call; do not keep it.
type Match struct {
	// Chars is how many leading characters of the text the tree holds; 0 when none.
	Chars int
	// Total is the number of characters in the text.
	Total int
	// Tenants are the tenants recorded on the longest matched prefix, in no particular order;
	// empty when Chars is 0.
	Tenants []string
	// Shared is how many leading characters of the text the tree holds for two or more tenants:
	// a common opening (a system prompt every request starts with) rather than one worker's
	// prompt.
	Shared int
	// Holders are the tenants that hold more than the holder ratio given to RouteHolders of the
	// text (a superset of Tenants when the match exceeds that ratio); empty otherwise.
	Holders []string
}

// Ratio returns Chars/Total, or 0 for an empty text.
func (m *Match) Ratio() float64 {
	if m.Total == 0 {
		return 0
	}
	return float64(m.Chars) / float64(m.Total)
}

// appendTenants appends the live tenants of n, which the caller has locked.
func (t *Tree) appendTenants(dst []string, n *node) []string {
	tab := t.tenants.Load()
	for _, e := range n.tenants {
		if tn := tab.byIdx[e.idx]; tn.live(e) {
			dst = append(dst, tn.name)
		}
	}
	return dst
}

// Route matches text against the tree and records it for the tenant that choose returns, in one
// descent. choose runs while the deepest matched node is locked, so that nothing can change the
// match before the text is recorded: it must be quick and must not call the tree. If it returns
// "", nothing is recorded. Route returns the Match as choose saw it, without Tenants.
func (t *Tree) Route(text string, choose func(m *Match) string) (chars, total int) {
	return t.RouteHolders(text, 1, choose)
}

// RouteHolders is Route that also gives choose the Holders: every tenant that holds more than
// ratio of the text, not only those on the deepest matched node. A node's tenants include the
// tenants of all nodes below it, so they are the tenants of the shallowest node on the path at
// which more than ratio of the text has matched, collected in the same descent.
func (t *Tree) RouteHolders(text string, ratio float64, choose func(m *Match) string) (chars, total int) {
	chars, total, _ = t.route(text, ratio, nil, choose)
	return chars, total
}

// RouteDepths is Route that first tells depth, for every tenant holding some prefix of the text,
// how many leading characters of it the tenant holds. depth runs during the descent, shallow to
// deep, while the node it reports is locked, so a tenant may be reported several times: its last
// report is its depth. Like choose, it must be quick and must not call the tree.
func (t *Tree) RouteDepths(text string, depth func(tenant string, chars int), choose func(m *Match) string) (chars, total int) {
	chars, total, _ = t.route(text, 1, depth, choose)
	return chars, total
}

// RouteAged is RouteDepths that also returns what the tree held for the chosen tenant on the
// text's path before this call recorded it there (limit.go): the teacher of a tenant's limit
// compares it with what the tenant's engine then reports. Prior is zero when choose returns ""
// or the tenant held no prefix of the text.
func (t *Tree) RouteAged(text string, depth func(tenant string, chars int), choose func(m *Match) string) Prior {
	_, _, prior := t.route(text, 1, depth, choose)
	return prior
}

// route is the descent of RouteHolders, RouteDepths and RouteAged. The Match shows only the
// records that are live (limit.go); matched counts every node the text runs through, which is
// where the text is recorded.
func (t *Tree) route(text string, ratio float64, depth func(string, int), choose func(m *Match) string) (chars, total int, prior Prior) {
	m := t.matchPool.Get().(*Match)
	m.Total = charCount(text)
	need := int(ratio*float64(m.Total)) + 1 // matched > ratio × total
	m.Holders = m.Holders[:0]
	m.Tenants = m.Tenants[:0]
	m.Shared = 0
	m.Chars = 0
	limited := t.limited.Load()
	n := t.root
	n.mu.Lock()
	pos, matched, cut := 0, 0, 0 // cut: bytes of n's edge matched when the text diverges inside it
	for pos < len(text) {
		c := n.child(unitKey(text[pos:]))
		if c == nil {
			break
		}
		c.mu.Lock()
		n.mu.Unlock()
		n = c
		k := commonPrefix(c.edge, text[pos:])
		pos += k
		before := matched
		if k < len(c.edge) {
			cut = k
			matched += charCount(c.edge[:k])
		} else {
			matched += int(c.chars)
		}
		if before < need && matched >= need {
			m.Holders = t.appendTenants(m.Holders, c)
		}
		if !limited {
			if len(c.tenants) >= 2 {
				m.Shared = matched
			}
		} else if live := t.liveCount(c); live > 0 {
			// Records past their tenant's limit are hidden: the match ends at the deepest node
			// that shows one, with its tenants.
			m.Chars = matched
			m.Tenants = t.appendTenants(m.Tenants[:0], c)
			if live >= 2 {
				m.Shared = matched
			}
		}
		if depth != nil {
			tab := t.tenants.Load()
			for _, e := range c.tenants {
				if tn := tab.byIdx[e.idx]; tn.live(e) {
					depth(tn.name, matched)
				}
			}
		}
		if cut > 0 {
			break
		}
	}
	if !limited {
		m.Chars = matched
		if n != t.root {
			m.Tenants = t.appendTenants(m.Tenants, n)
		}
	}
	chars = m.Chars
	name := choose(m)
	total = m.Total
	clear(m.Tenants)
	clear(m.Holders)
	t.matchPool.Put(m)
	if name == "" {
		n.mu.Unlock()
		return chars, total, prior
	}
	tn := t.tenant(name)
	stamp := t.now().UnixNano()
	if cut > 0 {
		n.split(cut)
	}
	if pos < len(text) {
		n.addLeaf(strings.Clone(text[pos:]), tn, stamp)
	}
	below := 0 // n's characters, read under its lock for the climb
	if n != t.root {
		if age, had := n.touch(tn, stamp); had {
			prior = Prior{Chars: matched, Age: age}
		}
		below = int(n.chars)
	}
	n.mu.Unlock()
	if n != t.root {
		t.touchAncestors(n, tn, stamp, matched-below, &prior)
	}
	return chars, total, prior
}

// Opening returns how many leading bytes of text the tree holds for two or more tenants: the
// Match's Shared, in bytes, found without recording anything. It is the opening that several
// tenants' texts share (a system prompt every request starts with), and the descent stops where
// it ends: a node's tenants include those of every node below it, so no deeper node is shared.
// The boundary is a character boundary of text.
func (t *Tree) Opening(text string) int {
	limited := t.limited.Load()
	n := t.root
	n.mu.Lock()
	pos := 0
	for pos < len(text) {
		c := n.child(unitKey(text[pos:]))
		if c == nil {
			break
		}
		c.mu.Lock()
		n.mu.Unlock()
		n = c
		if limited && t.liveCount(c) < 2 || !limited && len(c.tenants) < 2 {
			break
		}
		k := commonPrefix(c.edge, text[pos:])
		pos += k
		if k < len(c.edge) {
			break
		}
	}
	n.mu.Unlock()
	return pos
}

// Insert records text for tenant: Route with a fixed choice.
func (t *Tree) Insert(text, tenant string) {
	t.Route(text, func(*Match) string { return tenant })
}

// Lookup returns the longest stored prefix of text in characters and the tenants holding it,
// without recording anything.
func (t *Tree) Lookup(text string) (chars int, tenants []string) {
	chars, _ = t.Route(text, func(m *Match) string {
		tenants = slices.Clone(m.Tenants)
		return ""
	})
	return chars, tenants
}

// Size returns the characters recorded for tenant; 0 for an unknown or removed tenant.
func (t *Tree) Size(tenant string) int64 {
	if tn := t.tenants.Load().byName[tenant]; tn != nil {
		return tn.size.Load()
	}
	return 0
}

// Sizes returns tenant → characters recorded, for every current tenant.
func (t *Tree) Sizes() map[string]int64 {
	tab := t.tenants.Load()
	out := make(map[string]int64, len(tab.byName))
	for name, tn := range tab.byName {
		out[name] = tn.size.Load()
	}
	return out
}

// child returns n's child whose edge starts with the character key, or nil. n is locked.
func (n *node) child(key int32) *node {
	i, ok := slices.BinarySearch(n.keys, key)
	if !ok {
		return nil
	}
	return n.children[i]
}

// addLeaf adds a child with edge text for tenant tn. n is locked; text is owned by the tree.
func (n *node) addLeaf(text string, tn *tenant, stamp int64) {
	c := &node{edge: text, key: unitKey(text), chars: int32(charCount(text))}
	tn.size.Add(int64(c.chars))
	c.tenants = []entry{{idx: tn.idx, seq: tn.seq(), stamp: stamp}}
	c.hits = 1
	c.parent.Store(n)
	i, _ := slices.BinarySearch(n.keys, c.key)
	n.children = slices.Insert(n.children, i, c)
	n.keys = slices.Insert(n.keys, i, c.key)
}

// split cuts n's edge after k bytes (a character boundary): n keeps the first part and its
// place in the tree, a new child takes the rest with n's children and a copy of its tenants.
// Keeping n as the upper part means no lock above n is needed. n is locked.
func (n *node) split(k int) {
	rest := n.edge[k:]
	s := &node{edge: rest, key: unitKey(rest), chars: int32(charCount(rest))}
	s.children, s.keys = n.children, n.keys
	s.tenants = slices.Clone(n.tenants)
	s.hits = n.hits // everything that ran through n ran through its lower part
	s.parent.Store(n)
	for _, c := range s.children {
		c.parent.Store(s) // under n's lock: n was c's parent
	}
	n.edge = n.edge[:k]
	n.chars -= s.chars
	n.children, n.keys = []*node{s}, []int32{s.key}
}

// touch records tenant tn on n at stamp, counting n's characters if tn is new here, and counts
// one more hit on n. It returns the age the record had on tn's clock (limit.go), had false when
// tn was new here. n is locked.
func (n *node) touch(tn *tenant, stamp int64) (age int64, had bool) {
	if n.hits < math.MaxUint32 {
		n.hits++
	}
	for i := range n.tenants {
		if e := &n.tenants[i]; e.idx == tn.idx {
			age = tn.age(*e)
			e.stamp, e.seq = max(e.stamp, stamp), tn.seq()
			return age, true
		}
	}
	tn.size.Add(int64(n.chars))
	n.tenants = append(n.tenants, entry{idx: tn.idx, seq: tn.seq(), stamp: stamp})
	return 0, false
}

// touchAncestors records tn at stamp on every ancestor of n below the root, bottom-up, holding
// one lock at a time. end is the characters from the root to the start of n's edge; prior, if
// it is still zero, gets the deepest ancestor that already held tn (its end and its age).
func (t *Tree) touchAncestors(n *node, tn *tenant, stamp int64, end int, prior *Prior) {
	for {
		p := n.parent.Load()
		if p == nil || p == t.root {
			return
		}
		p.mu.Lock()
		if n.parent.Load() != p { // p was split above n meanwhile: climb from the new parent
			p.mu.Unlock()
			continue
		}
		if p.dead {
			p.mu.Unlock()
			return
		}
		if age, had := p.touch(tn, stamp); had && prior.Chars == 0 {
			*prior = Prior{Chars: end, Age: age}
		}
		end -= int(p.chars)
		p.mu.Unlock()
		n = p
	}
}

// tenant returns the live tenant named name, creating it if needed.
func (t *Tree) tenant(name string) *tenant {
	if tn := t.tenants.Load().byName[name]; tn != nil {
		return tn
	}
	t.tmu.Lock()
	defer t.tmu.Unlock()
	old := t.tenants.Load()
	if tn := old.byName[name]; tn != nil {
		return tn
	}
	tn := &tenant{name: name, idx: uint32(len(old.byIdx))}
	tab := &tenantTable{byName: maps.Clone(old.byName), byIdx: append(slices.Clip(old.byIdx), tn)}
	tab.byName[name] = tn
	t.tenants.Store(tab)
	return tn
}
