package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// randomPool returns n bytes of random lowercase text; prompts are cut from it at random offsets.
func randomPool(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz  .,"[r.IntN(30)]
	}
	return string(b)
}

// storedChars returns the characters held by the tree's edges (each stored once, whatever the
// number of tenants).
func storedChars(t *Tree) int64 {
	var n int64
	var rec func(*node)
	rec = func(x *node) {
		n += int64(x.chars)
		for _, c := range x.children {
			rec(c)
		}
	}
	rec(t.root)
	return n
}

// BenchmarkTreeBytesPerChar measures the heap the tree takes per character it stores, for long
// prompts (64 shared 2 KB system prompts, unique 6 KB tails, 64 tenants). Target: ≤ 3 B/char.
//
//	go test -run XXX -bench TreeBytesPerChar -benchtime 3x ./internal/radix/
func BenchmarkTreeBytesPerChar(b *testing.B) {
	for _, prompts := range []int{1000, 4000} {
		b.Run(fmt.Sprintf("prompts=%d", prompts), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			pool := randomPool(r, 32<<20)
			systems := make([]string, 64)
			for i := range systems {
				systems[i] = fmt.Sprintf("system %d: %s", i, pool[r.IntN(len(pool)-2048):][:2048])
			}
			var perChar float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tr := New(Options{})
				for i := range prompts {
					off := r.IntN(len(pool) - 6144)
					tr.Insert(systems[r.IntN(len(systems))]+pool[off:off+6144], fmt.Sprintf("w%d", i%64))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perChar = float64(after.HeapAlloc-before.HeapAlloc) / float64(storedChars(tr))
				runtime.KeepAlive(tr)
			}
			b.ReportMetric(perChar, "heapB/char")
		})
	}
}

// BenchmarkRoute measures one Route (match and record) of a 2 KB-system-prompt request against
// a tree of 16 K such requests, in parallel: compare -cpu 1,2 for scaling.
func BenchmarkRoute(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	pool := randomPool(r, 8<<20)
	tr := New(Options{})
	texts := make([]string, 16384)
	for i := range texts {
		off := r.IntN(len(pool) - 4096)
		texts[i] = fmt.Sprintf("system %d: ", i%64) + pool[off:off+4096]
		tr.Insert(texts[i], fmt.Sprintf("w%d", i%16))
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(texts))
		for pb.Next() {
			i = (i + 1) % len(texts)
			tr.Route(texts[i], func(m *Match) string {
				if len(m.Tenants) > 0 {
					return m.Tenants[0]
				}
				return "w0"
			})
		}
	})
}

// BenchmarkEvict times one eviction pass over a tree of 4,000 8 KB prompts (about 25 MB stored)
// for 64 tenants that each hold about 25 % more than the cap, so every pass walks the whole tree
// and drops records. Routing goes on meanwhile: a pass holds one or two node locks at a time.
//
//	go test -run XXX -bench Evict -benchtime 5x ./internal/radix/
func BenchmarkEvict(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	pool := randomPool(r, 32<<20)
	systems := make([]string, 64)
	for i := range systems {
		systems[i] = fmt.Sprintf("system %d: %s", i, pool[r.IntN(len(pool)-2048):][:2048])
	}
	var dropped int
	for b.Loop() {
		b.StopTimer()
		tr := New(Options{})
		for i := range 4000 {
			off := r.IntN(len(pool) - 6144)
			tr.Insert(systems[r.IntN(len(systems))]+pool[off:off+6144], fmt.Sprintf("w%d", i%64))
		}
		var maxSize int64
		for _, s := range tr.Sizes() {
			maxSize = max(maxSize, s)
		}
		b.StartTimer()
		dropped = tr.Evict(maxSize * 4 / 5)
	}
	b.ReportMetric(float64(dropped), "records-dropped")
}

// BenchmarkHot times one Hot call (a worker joining) over 16 K requests of 64 shared 2 KB
// system prompts and 4 KB tails, 16 tenants: about 100 MB of prompt text.
//
//	go test -run XXX -bench Hot -benchtime 20x ./internal/radix/
func BenchmarkHot(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	pool := randomPool(r, 8<<20)
	systems := make([]string, 64)
	for i := range systems {
		systems[i] = fmt.Sprintf("system %d: %s", i, pool[r.IntN(len(pool)-2048):][:2048])
	}
	tr := New(Options{})
	for i := range 16384 {
		off := r.IntN(len(pool) - 4096)
		tr.Insert(systems[i%64]+pool[off:off+4096], fmt.Sprintf("w%d", i%16))
	}
	b.ResetTimer()
	for b.Loop() {
		if len(tr.Hot(HotOptions{Limit: 32, Exclude: "w99", MinChars: 256})) == 0 {
			b.Fatal("nothing hot")
		}
	}
}
