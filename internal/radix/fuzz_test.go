package radix

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// alphabet mixes ASCII, two- and three-byte runes sharing lead bytes, and invalid bytes, so that
// the fuzzer reaches splits next to and inside multi-byte characters.
var alphabet = []string{"a", "b", "é", "è", "€", "\xff", "\x80", "\xc3", "\xe2\x82"}

// fuzzOps decodes data into operations on a tree and the naive model, checking after each that
// they agree on match results, tenancy, stamps and sizes, and that eviction keeps its promises.
func fuzzOps(t *testing.T, data []byte) {
	if len(data) > 600 {
		data = data[:600] // every op re-checks the whole tree: keep inputs quick
	}
	var clock int64
	tr := New(Options{Now: func() time.Time { return time.Unix(0, clock) }})
	m := newModel()
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	text := func() string {
		n := int(next() % 10)
		s := ""
		for range n {
			s += alphabet[int(next())%len(alphabet)]
		}
		return s
	}
	tenants := []string{"w0", "w1", "w2"}
	for len(data) > 0 {
		op := next()
		clock += int64(op % 2) // equal stamps happen too
		switch op % 8 {
		case 0, 1, 2, 3:
			s, w := text(), tenants[int(next())%len(tenants)]
			tr.Insert(s, w)
			m.insert(s, w, clock)
		case 4, 5:
			s := text()
			gotN, gotT := tr.Lookup(s)
			wantN, wantT := m.lookup(s)
			slices.Sort(gotT)
			if gotN != wantN || !slices.Equal(gotT, wantT) {
				t.Fatalf("Lookup(%q) = %d %v, model %d %v", s, gotN, gotT, wantN, wantT)
			}
			var shared int
			tr.Route(s, func(m *Match) string { shared = m.Shared; return "" })
			if got, want := tr.Opening(s), m.opening(s); got != want || charCount(s[:got]) != shared {
				t.Fatalf("Opening(%q) = %d, model %d, Route's Shared %d characters", s, got, want, shared)
			}
			ratio := float64(next()%10) / 10
			var gotH []string
			tr.RouteHolders(s, ratio, func(m *Match) string {
				gotH = append(gotH, m.Holders...)
				return ""
			})
			slices.Sort(gotH)
			if wantH := m.holders(s, ratio); !slices.Equal(gotH, wantH) {
				t.Fatalf("RouteHolders(%q, %v) holders %v, model %v", s, ratio, gotH, wantH)
			}
		case 6:
			budget := int64(next() % 16)
			before := m.held
			tr.Evict(budget)
			after := dump(tr)
			for _, w := range tenants {
				checkEviction(t, w, before[w], after[w], budget)
			}
			m.held = after
		case 7:
			w := tenants[int(next())%len(tenants)]
			tr.Remove(w)
			delete(m.held, w)
		}
		checkStructure(t, tr)
		got := dump(tr)
		for _, w := range tenants {
			if !maps.Equal(got[w], m.held[w]) {
				t.Fatalf("tenant %s holds %v, model %v", w, got[w], m.held[w])
			}
			if s := tr.Size(w); s != int64(len(m.held[w])) {
				t.Fatalf("Size(%s) = %d, model %d", w, s, len(m.held[w]))
			}
		}
	}
}

// FuzzTree checks the tree against the naive model. `go test` runs the seeds only. Every input
// takes milliseconds (each op re-checks the whole tree), so bound minimization when fuzzing:
//
//	go test -run XXX -fuzz FuzzTree -fuzztime 2m -fuzzminimizetime 200x ./internal/radix/
func FuzzTree(f *testing.F) {
	seeds := [][]byte{
		{},
		{0, 3, 0, 0, 0, 0, 4, 3, 0, 0, 0},
		{0, 4, 0, 0, 1, 2, 1, 1, 4, 0, 0, 3, 3, 0, 4, 4, 3, 0, 0, 5},
		{0, 5, 2, 2, 2, 2, 2, 0, 0, 5, 3, 3, 3, 3, 3, 1, 4, 3, 2, 2, 4, 6, 6, 4},
		{0, 9, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1, 1, 9, 7, 7, 7, 7, 8, 8, 8, 8, 8, 2, 4, 9, 7, 7, 7, 7, 7},
		{0, 6, 0, 1, 0, 1, 0, 1, 0, 1, 3, 6, 0, 1, 0, 1, 0, 0, 2, 6, 5, 0, 1, 0, 1, 0, 1, 14, 3, 7, 1},
		{2, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 3, 5, 1, 2, 3, 4, 5, 2, 0, 7, 1, 2, 3, 2, 1, 15, 4, 3, 0, 0},
		{0, 3, 6, 5, 6, 0, 1, 3, 6, 3, 4, 1, 0, 2, 6, 6, 1, 4, 3, 6, 5, 5, 0, 22, 4, 2, 6, 5, 0, 7, 0},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(fuzzOps)
}
