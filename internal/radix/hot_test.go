package radix

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

func hotTexts(hs []HotPrefix) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Text
	}
	return out
}

func TestHotSharedSystemPrompts(t *testing.T) {
	tr := New(Options{})
	sysA := "You are a careful assistant for the billing team. " + strings.Repeat("a", 200)
	sysB := "You are a careful assistant for the travel desk. " + strings.Repeat("b", 100)
	for i := range 10 {
		tr.Insert(sysA+fmt.Sprintf(" question %d?", i), "w0")
	}
	for i := range 6 {
		tr.Insert(sysB+fmt.Sprintf(" trip %d?", i), "w1")
	}
	tr.Insert("a prompt sent once and never again", "w1")

	got := tr.Hot(HotOptions{Limit: 5, MinChars: 20})
	// The two system prompts, most traffic first; not their common opening ("You are a careful
	// assistant for the "), which copying either copies, nor the one-off prompt or the tails.
	want := []string{sysA + " question ", sysB + " trip "}
	if !slices.Equal(hotTexts(got), want) {
		t.Fatalf("Hot = %q, want %q", hotTexts(got), want)
	}
	if got[0].Hits != 10 || got[1].Hits != 6 || got[0].Holders != 1 {
		t.Fatalf("hits %d, %d holders %d; want 10, 6 and 1", got[0].Hits, got[1].Hits, got[0].Holders)
	}
	if got := tr.Hot(HotOptions{Limit: 1, MinChars: 20}); len(got) != 1 || got[0].Text != want[0] {
		t.Fatalf("Limit 1 = %q, want the hottest only", hotTexts(got))
	}
}

func TestHotRepeatedPromptIsOneLeaf(t *testing.T) {
	// A tenant's long context cut to the routing limit: every request routes the same text.
	tr := New(Options{})
	ctx := strings.Repeat("tenant seven's contract ", 50)
	for range 4 {
		tr.Insert(ctx, "w2")
	}
	tr.Insert(strings.Repeat("tenant eight ", 40), "w0") // once: not reused
	got := tr.Hot(HotOptions{Limit: 4})
	if len(got) != 1 || got[0].Text != ctx || got[0].Hits != 4 || got[0].Chars != len(ctx) {
		t.Fatalf("Hot = %+v, want the repeated context with 4 hits", got)
	}
}

func TestHotExcludeSinceAndCut(t *testing.T) {
	var clock int64
	tr := New(Options{Now: func() time.Time { return time.Unix(0, clock) }})
	old, fresh, mine := strings.Repeat("o", 100), strings.Repeat("f", 100), strings.Repeat("m", 100)
	clock = 10
	tr.Insert(old+"1", "w0")
	tr.Insert(old+"2", "w0")
	clock = 20
	tr.Insert(fresh+"1", "w0")
	tr.Insert(fresh+"2", "w1")
	tr.Insert(mine+"1", "new")
	tr.Insert(mine+"2", "new")

	got := tr.Hot(HotOptions{Limit: 10, Exclude: "new"})
	if !slices.Equal(hotTexts(got), []string{fresh, old}) { // equal scores: the fresher first
		t.Fatalf("Hot = %q, want fresh then old, and nothing held by the excluded tenant", hotTexts(got))
	}
	if got[0].Holders != 2 || !got[0].Last.Equal(time.Unix(0, 20)) {
		t.Fatalf("fresh: holders %d last %v, want 2 and 20ns", got[0].Holders, got[0].Last)
	}
	got = tr.Hot(HotOptions{Limit: 10, Exclude: "new", Since: time.Unix(0, 15)})
	if !slices.Equal(hotTexts(got), []string{fresh}) {
		t.Fatalf("Since 15 = %q, want only the fresh prefix", hotTexts(got))
	}
	got = tr.Hot(HotOptions{Limit: 10, Exclude: "new", MaxChars: 7})
	if len(got) != 2 || got[0].Text != fresh[:7] || got[0].Chars != 100 {
		t.Fatalf("MaxChars 7 = %+v, want 7-character texts of 100-character prefixes", got)
	}
	if got := tr.Hot(HotOptions{Limit: 1, Exclude: "new", MaxBytes: 99}); len(got) != 0 {
		t.Fatalf("MaxBytes 99 = %q, want none", hotTexts(got))
	}
	if got := tr.Hot(HotOptions{Limit: 1, Exclude: "new", MaxBytes: 100}); len(got) != 1 {
		t.Fatalf("MaxBytes 100 = %q, want one", hotTexts(got))
	}
	if got := tr.Hot(HotOptions{Limit: 10, MinChars: 101}); len(got) != 0 {
		t.Fatalf("MinChars 101 = %q, want none", hotTexts(got))
	}
	if got := tr.Hot(HotOptions{}); got != nil {
		t.Fatalf("Limit 0 = %q, want nil", hotTexts(got))
	}
	tr.Remove("w0")
	if got := tr.Hot(HotOptions{Limit: 10, Exclude: "new"}); !slices.Equal(hotTexts(got), []string{fresh}) {
		t.Fatalf("after removing w0: %q, want the prefix w1 still holds", hotTexts(got))
	}
}

// hasCharPrefix reports whether p is a prefix of s that ends between two characters of s.
func hasCharPrefix(s, p string) bool {
	if !strings.HasPrefix(s, p) {
		return false
	}
	for i := range s {
		if i >= len(p) {
			return i == len(p)
		}
	}
	return len(p) == len(s)
}

// naiveHits counts the recorded texts that start with p.
func naiveHits(texts []string, p string) int {
	n := 0
	for _, s := range texts {
		if hasCharPrefix(s, p) {
			n++
		}
	}
	return n
}

// FuzzHot checks Hot's promises against the recorded texts: every prefix offered was recorded
// by a tenant other than the excluded one, carries exactly the hits of the texts that start
// with it, is where reuse stops growing longer, is not the start of another one offered, and the
// best of all that qualify is offered or covered by a longer one. `go test` runs the seeds only:
//
//	go test -run XXX -fuzz FuzzHot -fuzztime 1m ./internal/radix/
func FuzzHot(f *testing.F) {
	f.Add([]byte{0, 3, 0, 0, 0, 1, 3, 0, 0, 1, 2, 3, 0, 0, 2}, uint8(3), uint8(2), uint8(0))
	f.Add([]byte{5, 1, 2, 3, 4, 5, 5, 1, 2, 3, 4, 5, 2, 1, 2, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 0}, uint8(5), uint8(1), uint8(2))
	f.Add([]byte{3, 7, 7, 7, 1, 7, 7, 7, 2, 7, 7, 8, 0, 7, 7, 8}, uint8(1), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, limit, minHits, exclude uint8) {
		if len(data) > 400 {
			data = data[:400]
		}
		tr := New(Options{})
		tenants := []string{"w0", "w1", "w2"}
		var texts []string
		held := map[string][]string{} // tenant → texts
		for len(data) > 1 {
			n := int(data[0] % 10)
			w := tenants[int(data[1])%len(tenants)]
			data = data[2:]
			var sb strings.Builder
			for ; n > 0 && len(data) > 0; n-- {
				sb.WriteString(alphabet[int(data[0])%len(alphabet)])
				data = data[1:]
			}
			s := sb.String()
			tr.Insert(s, w)
			if s != "" {
				texts = append(texts, s)
				held[w] = append(held[w], s)
			}
		}
		opts := HotOptions{Limit: int(limit % 6), MinHits: int(minHits % 4), MaxBytes: int(minHits/4) % 12}
		if exclude%4 < 3 {
			opts.Exclude = tenants[exclude%4]
		}
		holds := func(w, p string) bool {
			return slices.ContainsFunc(held[w], func(s string) bool { return hasCharPrefix(s, p) })
		}
		qualifies := func(p string) bool {
			h := naiveHits(texts, p)
			if h < max(opts.MinHits, 2) || (opts.MaxBytes > 0 && len(p) > opts.MaxBytes) || (opts.Exclude != "" && holds(opts.Exclude, p)) {
				return false
			}
			other := false
			next := map[string]int{}
			for _, w := range tenants {
				other = other || (w != opts.Exclude && holds(w, p))
			}
			for _, s := range texts {
				if len(s) > len(p) && hasCharPrefix(s, p) {
					_, size := utf8.DecodeRuneInString(s[len(p):])
					next[s[len(p):len(p)+size]]++
				}
			}
			for _, c := range next {
				if 2*c > h {
					return false
				}
			}
			return other
		}
		got := tr.Hot(opts)
		if len(got) > opts.Limit {
			t.Fatalf("%d prefixes, limit %d", len(got), opts.Limit)
		}
		for i, h := range got {
			if h.Chars != utf8.RuneCountInString(h.Text) {
				t.Fatalf("%q: Chars %d", h.Text, h.Chars)
			}
			if want := naiveHits(texts, h.Text); h.Hits != want {
				t.Fatalf("%q: Hits %d, want %d", h.Text, h.Hits, want)
			}
			if !qualifies(h.Text) {
				t.Fatalf("%q (hits %d) offered but does not qualify (opts %+v, texts %q)", h.Text, h.Hits, opts, texts)
			}
			for j, o := range got {
				if i != j && hasCharPrefix(o.Text, h.Text) {
					t.Fatalf("%q offered with its extension %q", h.Text, o.Text)
				}
			}
			if i > 0 && h.Chars*h.Hits > got[i-1].Chars*got[i-1].Hits {
				t.Fatalf("not in score order: %+v", got)
			}
		}
		if opts.Limit == 0 {
			return
		}
		best, bests := 0, []string{}
		for _, s := range texts {
			for _, p := range prefixes(s) {
				sc := utf8.RuneCountInString(p) * naiveHits(texts, p)
				if sc < best || !qualifies(p) {
					continue
				}
				if sc > best {
					best, bests = sc, bests[:0]
				}
				bests = append(bests, p)
			}
		}
		// One of the best is offered, or a longer prefix that starts with it (copying that
		// copies it).
		covered := slices.ContainsFunc(got, func(h HotPrefix) bool {
			return slices.ContainsFunc(bests, func(p string) bool { return hasCharPrefix(h.Text, p) })
		})
		switch {
		case best == 0 && len(got) > 0:
			t.Fatalf("nothing qualifies, got %+v", got)
		case best > 0 && !covered:
			t.Fatalf("best %q (score %d) not covered by %+v", bests, best, got)
		}
	})
}

// TestHotConcurrent runs Hot while other goroutines route, split and evict, for the race
// detector, and checks that what it returns is always a prefix some goroutine recorded.
func TestHotConcurrent(t *testing.T) {
	tr := New(Options{})
	base := strings.Repeat("shared opening ", 10)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				tr.Insert(fmt.Sprintf("%s%d tenant %d question %d", base, g, i%7, i), fmt.Sprintf("w%d", g))
				if i%50 == 0 {
					tr.Evict(2000)
				}
			}
		}()
	}
	for range 20 {
		for _, h := range tr.Hot(HotOptions{Limit: 8, Exclude: "w0"}) {
			if recorded := strings.HasPrefix(h.Text, base) || strings.HasPrefix(base, h.Text); !recorded || h.Hits < 2 {
				t.Fatalf("Hot offered %q with %d hits", h.Text, h.Hits)
			}
		}
	}
	wg.Wait()
}
