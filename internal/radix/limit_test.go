package radix

import (
	"testing"
)

// TestLimitHidesWhatAgedOnTheTenantsClock: a tenant's records older than its limit on its own
// clock match nothing (Lookup, the depth callback, Match.Shared), while its newer records and
// another tenant's records of the same text still do; the route that records a hidden text
// again reports the hidden record's end and age as its Prior, and brings it back.
func TestLimitHidesWhatAgedOnTheTenantsClock(t *testing.T) {
	tr := New(Options{})
	open := "the same opening / "
	a, b := open+"first conversation", open+"second conversation"
	tr.Insert(a, "w")
	tr.Insert(a, "v")
	tr.Advance("w", 100) // the engine behind w cached 100 units since a
	tr.Insert(b, "w")
	tr.Advance("w", 30)
	if chars, _ := tr.Lookup(a); chars != CharCount(a) {
		t.Fatalf("no limit: a matches %d chars, want all %d", chars, CharCount(a))
	}
	tr.SetLimit("w", 50) // a is 130 old on w's clock, b 30
	chars, tenants := tr.Lookup(a)
	if chars != CharCount(a) || len(tenants) != 1 || tenants[0] != "v" {
		t.Fatalf("a after the limit: %d chars on %v, want all of it on v alone", chars, tenants)
	}
	depths := map[string]int{}
	var shared int
	tr.RouteDepths(a, func(tn string, c int) { depths[tn] = c }, func(m *Match) string { shared = m.Shared; return "" })
	if depths["w"] != CharCount(open) || depths["v"] != CharCount(a) {
		t.Fatalf("depths of a: %v; want w only the opening (b touched it 30 ago), v all of a", depths)
	}
	if shared != CharCount(open) {
		t.Fatalf("a's shared opening: %d chars, want %d (w's hidden tail is not shared)", shared, CharCount(open))
	}
	if chars, tenants := tr.Lookup(b); chars != CharCount(b) || len(tenants) != 1 || tenants[0] != "w" {
		t.Fatalf("b, 30 old under a limit of 50: %d chars on %v, want all of it on w", chars, tenants)
	}
	prior := tr.RouteAged(a, nil, func(*Match) string { return "w" })
	if prior.Chars != CharCount(a) || prior.Age != 130 {
		t.Fatalf("prior of w on a: %+v, want its hidden record (all of a, age 130)", prior)
	}
	if chars, tenants := tr.Lookup(a); chars != CharCount(a) || len(tenants) != 2 {
		t.Fatalf("a recorded again for w: %d chars on %v, want all of it on both", chars, tenants)
	}
	if p := tr.RouteAged("never sent", nil, func(*Match) string { return "w" }); p != (Prior{}) {
		t.Fatalf("prior of a text w never held: %+v, want zero", p)
	}
}

// TestEvictDropsRecordsPastTwiceTheLimit: Evict keeps a tenant's hidden records up to twice its
// limit (a route's Prior still sees them) and drops older ones, with their characters.
func TestEvictDropsRecordsPastTwiceTheLimit(t *testing.T) {
	tr := New(Options{})
	tr.Insert("oldest text", "w")
	tr.Advance("w", 300)
	tr.Insert("middle text", "w")
	tr.Advance("w", 150)
	tr.Insert("newest text", "w")
	tr.SetLimit("w", 100) // ages 450, 150, 0
	tr.Evict(1 << 30)
	if got, want := tr.Size("w"), int64(2*CharCount("middle text")); got != want {
		t.Fatalf("after Evict w holds %d chars, want %d (the middle and newest texts)", got, want)
	}
	if p := tr.RouteAged("middle text", nil, func(*Match) string { return "" }); p != (Prior{}) {
		t.Fatalf("a route that records nothing reports %+v, want zero", p)
	}
	if p := tr.RouteAged("middle text", nil, func(*Match) string { return "w" }); p.Age != 150 {
		t.Fatalf("the hidden middle text's prior: %+v, want age 150", p)
	}
	if p := tr.RouteAged("oldest text", nil, func(*Match) string { return "w" }); p != (Prior{}) {
		t.Fatalf("the oldest text's prior: %+v, want none (Evict dropped it)", p)
	}
}

// TestLimitIsBounded: a hostile limit or clock step cannot make an age wrap.
func TestLimitIsBounded(t *testing.T) {
	tr := New(Options{})
	tr.Insert("x", "w")
	tr.SetLimit("w", 1<<62)
	if got := tr.Limit("w"); got != maxAge/2 {
		t.Fatalf("limit %d, want it bounded to %d", got, maxAge/2)
	}
	tr.SetLimit("w", -5)
	tr.Advance("w", 1<<62)
	if tr.Limit("w") != 0 {
		t.Fatal("a negative limit must mean none")
	}
	if p := tr.RouteAged("x", nil, func(*Match) string { return "w" }); p.Age != maxAge-1 {
		t.Fatalf("age after a huge step: %d, want it bounded to %d", p.Age, maxAge-1)
	}
	tr.SetLimit("nobody", 10)
	tr.Advance("nobody", 10)
	if len(tr.Tenants()) != 1 {
		t.Fatal("an unknown tenant must not be created")
	}
}
