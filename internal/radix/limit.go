package radix

import "slices"

// Limits: a tenant's records that grew too old on its own clock are hidden.
//
// Each tenant has a clock that its owner advances (Advance) by what the tenant's engine did
// since, in whatever unit the owner counts (the policies count the prompt tokens an engine
// newly cached, from its answers). Every record keeps the tenant's clock when it was last
// recorded; its age is how far that clock has run since. An engine whose prefix cache keeps C
// of those units evicts, least recently used first, a prefix about C units after it last
// served it, so a record older than C is a prediction the engine no longer keeps. SetLimit
// gives a tenant that C: from then on its records older than the limit match nothing (they are
// neither in a Match nor reported to a depth callback), and Evict drops those older than twice
// the limit (the band between is kept so that an owner whose limit was too low can still see,
// in a route's Prior, what the engine really kept). A tenant's records along one path are
// always as old or older the deeper they lie (recording a text touches every node above its
// end), so what a limit hides of a tenant is always the ends of its texts.
//
// Ages are kept in 32 bits (a record keeps its tenant's clock modulo 2^32); Evict drops every
// record older than maxAge, so no age it reports has wrapped as long as a tenant's clock runs
// less than 2^31 between two Evict passes.

// MaxLimit is the largest limit SetLimit sets.
const MaxLimit = maxAge / 2

// maxAge is the oldest age on a tenant's clock a record may reach before Evict drops it.
const maxAge = 1 << 31

// Prior is what the tree held for a tenant on a text's path before a route recorded the text
// for it: the deepest record of the tenant there, live or hidden. Zero when there was none.
type Prior struct {
	// Chars is the characters of the text from its start to the end of that record.
	Chars int
	// Age is the record's age on the tenant's clock then.
	Age int64
}

// seq returns tn's clock as records keep it.
func (tn *tenant) seq() uint32 { return uint32(tn.clock.Load()) }

// age returns e's age on tn's clock.
func (tn *tenant) age(e entry) int64 { return int64(tn.seq() - e.seq) }

// live reports whether e, a record of tn, may be matched: tn is not retired and e is not past
// tn's limit.
func (tn *tenant) live(e entry) bool {
	if tn.retired.Load() {
		return false
	}
	l := tn.limit.Load()
	return l <= 0 || tn.age(e) <= l
}

// liveCount returns how many of n's records are live. n is locked.
func (t *Tree) liveCount(n *node) int {
	tab := t.tenants.Load()
	live := 0
	for _, e := range n.tenants {
		if tab.byIdx[e.idx].live(e) {
			live++
		}
	}
	return live
}

// Advance runs tenant's clock forward by units (ignored unless positive). An unknown tenant is
// ignored.
func (t *Tree) Advance(tenant string, units int64) {
	if tn := t.tenants.Load().byName[tenant]; tn != nil && units > 0 {
		tn.clock.Add(min(units, maxAge-1))
	}
}

// Clock returns tenant's clock, 0 for an unknown tenant.
func (t *Tree) Clock(tenant string) int64 {
	if tn := t.tenants.Load().byName[tenant]; tn != nil {
		return tn.clock.Load()
	}
	return 0
}

// SetLimit hides tenant's records older than limit on its clock; limit ≤ 0 hides none. It is
// bounded to maxAge/2 (so that twice it is still an age Evict keeps apart). An unknown tenant
// is ignored.
func (t *Tree) SetLimit(tenant string, limit int64) {
	tn := t.tenants.Load().byName[tenant]
	if tn == nil {
		return
	}
	limit = min(max(limit, 0), MaxLimit)
	if limit > 0 {
		t.limited.Store(true)
	}
	tn.limit.Store(limit)
}

// Limit returns tenant's limit, 0 when it has none or is unknown.
func (t *Tree) Limit(tenant string) int64 {
	if tn := t.tenants.Load().byName[tenant]; tn != nil {
		return tn.limit.Load()
	}
	return 0
}

// keepAges returns, for every tenant whose records Evict must age out, the oldest age it keeps:
// twice a tenant's limit, or maxAge once its clock has run far enough for a record to reach it.
func keepAges(tab *tenantTable) map[uint32]int64 {
	var keep map[uint32]int64
	for _, tn := range tab.byName {
		k := int64(0)
		if l := tn.limit.Load(); l > 0 {
			k = 2 * l
		} else if tn.clock.Load() >= maxAge/2 {
			k = maxAge
		}
		if k > 0 {
			if keep == nil {
				keep = map[uint32]int64{}
			}
			keep[tn.idx] = k
		}
	}
	return keep
}

// dropAged drops n's records older than keep allows, and returns how many. n is locked.
func dropAged(n *node, tab *tenantTable, keep map[uint32]int64) int {
	if len(keep) == 0 {
		return 0
	}
	dropped := 0
	n.tenants = slices.DeleteFunc(n.tenants, func(e entry) bool {
		k, ok := keep[e.idx]
		if !ok {
			return false
		}
		tn := tab.byIdx[e.idx]
		if tn.age(e) <= k {
			return false
		}
		tn.size.Add(-int64(n.chars))
		dropped++
		return true
	})
	return dropped
}
