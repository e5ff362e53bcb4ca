package radix

import (
	"slices"
	"testing"
	"time"
)

// TestCorrectDropsWhatHangsBelowAnEvictedPrefix: an answer shows the engine held only the
// shared opening of a prompt; the worker's other prompts below that opening go, the prompt's own
// path and what hangs above the cut stay, and a record made after the answer's decision stays.
func TestCorrectDropsWhatHangsBelowAnEvictedPrefix(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	const open = "system prompt. "
	tr.Insert(open+"conversation one", "w1")
	clk.tick()
	tr.Insert(open+"conversation two", "w1")
	clk.tick()
	tr.Insert(open+"conversation one", "w2")
	before := clk.now()
	clk.tick()
	tr.Insert(open+"conversation three", "w1") // after the decision the answer belongs to
	size := tr.Size("w1")

	dropped := tr.Correct(open+"conversation two", "w1", CharCount(open), before)
	if dropped == 0 {
		t.Fatal("nothing dropped")
	}
	if chars, ts := tr.Lookup(open + "conversation one"); chars != len(open+"conversation one") || !slices.Equal(ts, []string{"w2"}) {
		t.Errorf("conversation one: %d chars held by %v, want all of it by w2 only", chars, ts)
	}
	for _, text := range []string{open + "conversation two", open + "conversation three"} {
		if chars, ts := tr.Lookup(text); chars != len(text) || !slices.Contains(ts, "w1") {
			t.Errorf("%q: %d chars held by %v, want all of it by w1", text, chars, ts)
		}
	}
	if got := tr.Size("w1"); got >= int64(size) {
		t.Errorf("w1's size %d, want below %d", got, size)
	}
	// A cut past where the prompts diverge drops nothing.
	if n := tr.Correct(open+"conversation two", "w2", len(open+"conversation two"), clk.now()); n != 0 {
		t.Errorf("a cut below every branch dropped %d records", n)
	}
	if n := tr.Correct(open+"x", "nobody", 0, clk.now()); n != 0 {
		t.Errorf("an unknown tenant dropped %d records", n)
	}
}

// TestCorrectKeepsSizesHonest: after corrections at random cuts, every tenant's size is the
// characters of the nodes it is recorded on (the invariant Evict relies on).
func TestCorrectKeepsSizesHonest(t *testing.T) {
	var clk fakeClock
	tr := New(Options{Now: clk.now})
	texts := []string{"aaaa-1111", "aaaa-2222", "aaaa-1133", "bbbb", "aaab", "aaaa-1111-xyz"}
	for i, s := range texts {
		tr.Insert(s, []string{"w1", "w2"}[i%2])
		clk.tick()
	}
	for cut := range 8 {
		tr.Correct(texts[cut%len(texts)], "w1", cut, clk.now().Add(time.Nanosecond))
		tr.Correct(texts[(cut+1)%len(texts)], "w2", cut, clk.now().Add(time.Nanosecond))
	}
	for _, ten := range []string{"w1", "w2"} {
		var sum int64
		tr.walk(func(n *node, _ int, _ int32) int32 {
			for _, e := range n.tenants {
				if tr.tenants.Load().byIdx[e.idx].name == ten {
					sum += int64(n.chars)
				}
			}
			return -1
		})
		if got := tr.Size(ten); got != sum {
			t.Errorf("%s: size %d, records %d", ten, got, sum)
		}
	}
}
