package radix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/testutil"
)

// fakeClock is a manual clock for stamps.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) tick()          { c.ns.Add(1) }

func TestCommonPrefix(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		want int
	}{
		{"equal", "hello", "hello", 5},
		{"ascii diverge", "hello world", "hello there", 6},
		{"long ascii", strings.Repeat("x", 40) + "a", strings.Repeat("x", 40) + "b", 40},
		{"prefix", "abc", "abcdef", 3},
		{"two-byte runes share lead byte", "aé", "aè", 1},
		{"three-byte runes share two bytes", "€", "₭", 0},
		{"truncated rune against whole rune", "a\xe2\x82", "a€", 1},
		{"invalid bytes match bytewise", "\xff\x80x", "\xff\x80y", 2},
		{"stray continuation bytes differ", "é\x80", "é\x81", 2},
		{"empty", "", "abc", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := commonPrefix(tt.a, tt.b); got != tt.want {
				t.Fatalf("commonPrefix(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

func TestRoute(t *testing.T) {
	type step struct {
		text, tenant string // tenant "" only looks up
		wantChars    int
		wantTenants  []string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"empty tree matches nothing", []step{{"hello", "", 0, nil}}},
		{"exact match", []step{{"hello", "a", 0, nil}, {"hello", "", 5, []string{"a"}}}},
		{"longer text matches stored prefix", []step{{"hello", "a", 0, nil}, {"hello world", "", 5, []string{"a"}}}},
		{"shorter text matches inside an edge", []step{{"hello world", "a", 0, nil}, {"hell", "", 4, []string{"a"}}}},
		{"divergence splits and keeps both tenants above it", []step{
			{"hello world", "a", 0, nil}, {"hello there", "b", 6, []string{"a"}},
			{"hello", "", 5, []string{"a", "b"}}, {"hello w", "", 7, []string{"a"}}, {"hello t", "", 7, []string{"b"}},
		}},
		{"multi-byte characters count once", []step{{"日本語です", "a", 0, nil}, {"日本語だ", "", 3, []string{"a"}}}},
		{"rune sharing a lead byte is not matched", []step{{"é", "a", 0, nil}, {"è", "", 0, nil}}},
		{"same tenant twice adds nothing", []step{{"abc", "a", 0, nil}, {"abc", "a", 3, []string{"a"}}, {"abc", "", 3, []string{"a"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(Options{})
			for i, s := range tt.steps {
				var seen []string
				chars, _ := tr.Route(s.text, func(m *Match) string {
					seen = slices.Clone(m.Tenants)
					return s.tenant
				})
				slices.Sort(seen)
				if chars != s.wantChars || !slices.Equal(seen, s.wantTenants) {
					t.Fatalf("step %d Route(%q): %d %v, want %d %v", i, s.text, chars, seen, s.wantChars, s.wantTenants)
				}
				checkStructure(t, tr)
			}
		})
	}
}

func TestSizes(t *testing.T) {
	tr := New(Options{})
	tr.Insert("hello world", "a")
	tr.Insert("hello there", "b")
	tr.Insert("héllo", "a")
	want := map[string]int64{"a": 11 + 5 - 1, "b": 11} // "h" is shared by a's two texts
	if got := tr.Sizes(); got["a"] != want["a"] || got["b"] != want["b"] || len(got) != 2 {
		t.Fatalf("Sizes() = %v, want %v", got, want)
	}
	if tr.Size("nobody") != 0 {
		t.Fatal("unknown tenant has a size")
	}
}

func TestRemove(t *testing.T) {
	tr := New(Options{})
	tr.Insert("shared prefix one", "a")
	tr.Insert("shared prefix two", "b")
	tr.Insert("only a", "a")
	tr.Remove("a")
	if n, ts := tr.Lookup("shared prefix one"); n != 14 || !slices.Equal(ts, []string{"b"}) {
		t.Fatalf("after Remove: Lookup = %d %v, want 14 [b]", n, ts)
	}
	if n, _ := tr.Lookup("only a"); n != 0 {
		t.Fatalf("removed tenant's own text still matches %d chars", n)
	}
	if tr.Size("a") != 0 || slices.Contains(tr.Tenants(), "a") {
		t.Fatal("removed tenant still accounted")
	}
	checkStructure(t, tr)
	tr.Insert("only a", "a") // comes back fresh
	if tr.Size("a") != 6 {
		t.Fatalf("re-added tenant size %d, want 6", tr.Size("a"))
	}
	tr.Remove("nobody")
	checkStructure(t, tr)
}

func TestEvictOldestFirst(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	tr.Insert("aaaa-old", "w")
	clk.tick()
	tr.Insert("bbbb-new", "w")
	clk.tick()
	tr.Insert("cccc-newest", "w")
	tr.Evict(20)
	if n, _ := tr.Lookup("aaaa-old"); n != 0 {
		t.Fatalf("oldest text survived eviction (%d chars)", n)
	}
	for _, s := range []string{"bbbb-new", "cccc-newest"} {
		if n, _ := tr.Lookup(s); n != len(s) {
			t.Fatalf("%q lost by eviction: %d chars left", s, n)
		}
	}
	if tr.Size("w") != 19 {
		t.Fatalf("size after eviction %d, want 19", tr.Size("w"))
	}
	checkStructure(t, tr)
}

func TestEvictTrimsLeavesBeforeSharedPrefix(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	tr.Insert("system prompt: user one", "w")
	clk.tick()
	tr.Insert("system prompt: user two", "w")
	tr.Evict(24)
	if n, _ := tr.Lookup("system prompt: user two"); n != 23 {
		t.Fatalf("newest text trimmed: %d chars left", n)
	}
	if n, _ := tr.Lookup("system prompt: user one"); n != 20 {
		t.Fatalf("shared prefix not kept: %d chars left, want 20", n)
	}
}

// TestEvictStaysCapped runs a long simulated workload (shared system prompts plus unique tails,
// several tenants, periodic eviction) and checks that every tenant stays within the cap.
func TestEvictStaysCapped(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	r := rand.New(rand.NewPCG(7, 7))
	const maxChars = 2000
	systems := make([]string, 8)
	for i := range systems {
		systems[i] = fmt.Sprintf("system %d: %s", i, randText(r, 200))
	}
	for i := range 20000 {
		clk.tick()
		text := systems[r.IntN(len(systems))] + randText(r, 20+r.IntN(100))
		tr.Insert(text, fmt.Sprintf("w%d", r.IntN(4)))
		if i%500 == 499 {
			tr.Evict(maxChars)
			for w, s := range tr.Sizes() {
				if s > maxChars {
					t.Fatalf("after eviction %d: %s holds %d > %d", i, w, s, maxChars)
				}
			}
		}
	}
	checkStructure(t, tr)
	if nodes := countNodes(tr); nodes > 4*(maxChars/20)*4 {
		t.Fatalf("%d nodes linger after eviction", nodes)
	}
}

func randText(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz "[r.IntN(27)]
	}
	return string(b)
}

func countNodes(tr *Tree) int {
	n := 0
	var rec func(*node)
	rec = func(x *node) {
		n++
		for _, c := range x.children {
			rec(c)
		}
	}
	rec(tr.root)
	return n
}

// TestConcurrent routes, evicts and removes from many goroutines at once; the race detector
// checks the locking, and the structure check afterwards that sizes stayed exact.
func TestConcurrent(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	systems := []string{"you are a helpful assistant. ", "you are a careful coder. ", "résumé: 日本語 "}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 2000 {
				clk.tick()
				text := systems[r.IntN(len(systems))] + randText(r, r.IntN(40))
				switch {
				case g == 0 && i%200 == 0:
					tr.Evict(300)
				case g == 1 && i%500 == 0:
					tr.Remove(fmt.Sprintf("w%d", r.IntN(4)))
				default:
					tr.Route(text, func(m *Match) string {
						if len(m.Tenants) > 0 && m.Ratio() > 0.5 {
							return m.Tenants[0]
						}
						return fmt.Sprintf("w%d", r.IntN(4))
					})
				}
			}
		}()
	}
	wg.Wait()
	checkStructure(t, tr)
	tr.Evict(300)
	for w, s := range tr.Sizes() {
		if s > 300 {
			t.Fatalf("%s holds %d after a quiet eviction", w, s)
		}
	}
}

func TestCharCount(t *testing.T) {
	for _, s := range []string{"", "abc", strings.Repeat("x", 17), "0123456é89abcdef日本語", "\xff\x80\x80abcdefghij\xe2\x82", strings.Repeat("é€\xc3", 9) + "abcdefghijk",
		strings.Repeat("a", 70) + "日" + strings.Repeat("b", 40) + "\xe2\x82" + strings.Repeat("c", 33)} {
		if got, want := charCount(s), utf8.RuneCountInString(s); got != want {
			t.Errorf("charCount(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestDisjointPrefixesDoNotSerialize holds one request inside its choice (its deepest node
// locked) and routes requests with other prefixes meanwhile: with a global lock they would
// wait, and this test would hang.
func TestDisjointPrefixesDoNotSerialize(t *testing.T) {
	tr := New(Options{})
	tr.Insert("system prompt A: hello", "w1")
	tr.Insert("system prompt B: hello", "w2")
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tr.Route("system prompt A: hello again", func(*Match) string {
			close(entered)
			<-release
			return "w1"
		})
	}()
	testutil.Recv(t, entered, "Route's choose callback")
	for _, text := range []string{"system prompt B: bye", "unrelated", "system prompt C"} {
		tr.Insert(text, "w3")
	}
	if n, ts := tr.Lookup("system prompt B: bye"); n != 20 || !slices.Equal(ts, []string{"w3"}) {
		t.Fatalf("Lookup = %d %v while another request was choosing", n, ts)
	}
	close(release)
	testutil.Recv(t, done, "Route's return")
	checkStructure(t, tr)
}

// TestRouteHolders: the holders of more than the ratio are every tenant that shares enough of
// the text, while Tenants are only those on the deepest matched node.
func TestRouteHolders(t *testing.T) {
	tr := New(Options{})
	prefix := strings.Repeat("p", 80)
	tr.Insert(prefix+"aaaaaaaaaaaaaaaaaaaa", "a")
	tr.Insert(prefix+"bbbbbbbbbbbbbbbbbbbb", "b")
	tr.Insert(prefix[:30], "short")
	cases := []struct {
		ratio       float64
		tenants     []string
		holders     []string
		wantMatched int
	}{
		{ratio: 0.5, tenants: []string{"a"}, holders: []string{"a", "b"}, wantMatched: 90},
		{ratio: 0.85, tenants: []string{"a"}, holders: []string{"a"}, wantMatched: 90},
		{ratio: 0.2, tenants: []string{"a"}, holders: []string{"a", "b", "short"}, wantMatched: 90},
		{ratio: 0.95, tenants: []string{"a"}, holders: nil, wantMatched: 90},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.ratio), func(t *testing.T) {
			var tenants, holders []string
			chars, total := tr.RouteHolders(prefix+"aaaaaaaaaaXXXXXXXXXX", tc.ratio, func(m *Match) string {
				tenants = append([]string(nil), m.Tenants...)
				holders = append([]string(nil), m.Holders...)
				return ""
			})
			slices.Sort(tenants)
			slices.Sort(holders)
			if chars != tc.wantMatched || total != 100 {
				t.Fatalf("matched %d of %d", chars, total)
			}
			if !slices.Equal(tenants, tc.tenants) || !slices.Equal(holders, tc.holders) {
				t.Errorf("tenants %v holders %v, want %v and %v", tenants, holders, tc.tenants, tc.holders)
			}
		})
	}
}
