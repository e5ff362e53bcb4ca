package kvevents

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// heapInUse returns the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// fill stores n blocks of 16 tokens for src in chains of 32 blocks, hashes from base.
func fill(x *Index, src Source, n int, base uint64) {
	const bs, chain = 16, 32
	toks := make([]uint32, bs*chain)
	for c := 0; c*chain < n; c++ {
		hs := make([]uint64, min(chain, n-c*chain))
		for i := range hs {
			hs[i] = base + uint64(c*chain+i) + 1
		}
		for i := range toks {
			toks[i] = uint32(c*7919 + i)
		}
		x.Apply(src, []Event{{Kind: BlockStored, Hashes: hs, Tokens: toks[:len(hs)*bs], BlockSize: bs}})
	}
}

// What a block costs, measured at several fill levels (maps double, so the cost per block
// swings between their emptiest and fullest): BytesPerBlock, which the documentation quotes,
// must bound it.
func TestIndexBytesPerBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("fills an index of 2^18 blocks")
	}
	worst := 0.0
	for _, n := range []int{100_000, 140_000, 200_000, 262_144} {
		before := heapInUse()
		x := NewIndex(1<<20, 4)
		fill(x, Source{Worker: "w"}, n, 0)
		per := float64(heapInUse()-before) / float64(n)
		runtime.KeepAlive(x)
		t.Logf("%d blocks: %.0f bytes a block", n, per)
		worst = max(worst, per)
	}
	if worst > BytesPerBlock {
		t.Fatalf("a block costs up to %.0f bytes; BytesPerBlock says %d", worst, BytesPerBlock)
	}
}

// The bound on blocks is per worker, over all its streams: a worker that spreads its blocks
// over many ranks cannot multiply it.
func TestIndexBoundIsPerWorker(t *testing.T) {
	x := NewIndex(1000, 64)
	for r := range 64 {
		fill(x, Source{Worker: "w", Rank: r}, 500, uint64(r)<<32)
	}
	fill(x, Source{Worker: "other"}, 300, 0)
	st := x.Stats()
	if st.Blocks != 1300 || st.Evicted != 64*500-1000 {
		t.Fatalf("stats %+v: want 1000 blocks of w and 300 of other", st)
	}
	// Eviction takes from the fullest stream: the ranks end up sharing the bound.
	lo, hi := 1000, 0
	for src, h := range x.sources {
		if src.Worker == "w" {
			lo, hi = min(lo, len(h.blocks)), max(hi, len(h.blocks))
		}
	}
	if hi-lo > 1 {
		t.Fatalf("w's streams hold from %d to %d blocks", lo, hi)
	}
	x.Forget("w")
	if st := x.Stats(); st.Blocks != 300 || x.workers["w"] != nil {
		t.Fatalf("after forgetting w: %+v", st)
	}
}

// Two engine hashes with the same tokens (blocks that differ only in what the tokens do not
// show, such as an image) map to one key: removing one keeps the other matchable.
func TestIndexSharedKeyIsCounted(t *testing.T) {
	x := NewIndex(100, 4)
	src := Source{Worker: "w"}
	x.Apply(src, []Event{stored([]uint64{1}, 0, false, 4, 1), stored([]uint64{2}, 0, false, 4, 1)})
	x.Apply(src, []Event{{Kind: BlockRemoved, Hashes: []uint64{1}}})
	out := []int{0}
	if !x.Match("", prompt(4, 1, 1), []string{"w"}, out, time.Now()) || out[0] != 4 {
		t.Fatalf("after removing one of two hashes of a block: %v", out)
	}
	x.Apply(src, []Event{{Kind: BlockRemoved, Hashes: []uint64{2}}})
	if x.Match("", prompt(4, 1, 1), []string{"w"}, out, time.Now()); out[0] != 0 {
		t.Fatalf("after removing both: %v", out)
	}
}

// A stream with another block size (a malformed one on an invented rank, or an engine
// configured differently) is matched at its own size: the others keep their answers.
func TestMatchMixedBlockSizes(t *testing.T) {
	x := NewIndex(100, 4)
	x.Apply(Source{Worker: "a"}, []Event{stored([]uint64{1, 2}, 0, false, 4, 1)})
	x.Apply(Source{Worker: "b"}, []Event{stored([]uint64{1}, 0, false, 4, 1)})
	x.Apply(Source{Worker: "b", Rank: 7}, []Event{stored([]uint64{9}, 0, false, 7, 1)})
	out := make([]int, 2)
	if !x.Match("", prompt(4, 1, 2), []string{"a", "b"}, out, time.Now()) || out[0] != 8 || out[1] != 4 {
		t.Fatalf("match %v, want [8 4]", out)
	}
	for i := range 3 {
		x.Apply(Source{Worker: "c", Rank: i}, []Event{stored([]uint64{uint64(i)}, 0, false, 1+i, 50)})
	}
	if !x.Match("", prompt(4, 1, 2), []string{"a", "b", "c"}, make([]int, 3), time.Now()) {
		t.Fatal("more block sizes than the fast path holds: no answer")
	}
}

func BenchmarkIndexApply(b *testing.B) {
	for _, n := range []int{1 << 16} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				fill(NewIndex(1<<20, 4), Source{Worker: "w"}, n, 0)
			}
		})
	}
}

// MatchEach answers for the workers that have published and marks the others −1, where Match
// refuses the whole fleet.
func TestMatchEachAnswersPerWorker(t *testing.T) {
	x := NewIndex(100, 4)
	x.Apply(Source{Worker: "a"}, []Event{stored([]uint64{1, 2}, 0, false, 4, 1)})
	ids := []string{"a", "quiet"}
	out := make([]int, 2)
	if x.Match("", prompt(4, 1, 2), ids, out, time.Now()) {
		t.Fatal("Match answered for a worker that never published")
	}
	if !x.CoversAny("", ids, time.Now()) || x.CoversAny("", ids[1:], time.Now()) {
		t.Fatal("CoversAny wrong")
	}
	if n := x.MatchEach("", prompt(4, 1, 2), ids, out, time.Now()); n != 1 || out[0] != 8 || out[1] != -1 {
		t.Fatalf("MatchEach = %d, %v; want 1, [8 -1]", n, out)
	}
}
