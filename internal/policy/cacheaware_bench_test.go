package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// The speed targets of the cache-aware issue are ratios measured side by side in one process, so
// that a busy shared machine slows both sides alike. Commands and results: docs/benchmarks.md.

// benchPool returns n bytes of random text that prompts are cut from.
func benchPool(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz  .,"[r.IntN(30)]
	}
	return string(b)
}

// chatBody is what the gateway decodes from a chat request.
type chatBody struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Stream    bool `json:"stream"`
	MaxTokens int  `json:"max_tokens"`
}

// bigTree returns a cache_aware policy whose tree holds about treeBytes of distinct text for 64
// workers: 8 KB prompts made of one of 256 shared 3 KB system prompts and a unique 5 KB tail. Its
// MaxTreeSize is set to the largest worker's share, so that Evict keeps the tree at that size.
func bigTree(b *testing.B, treeBytes int) (p *CacheAware, ws []*worker.Worker, systems []string, pool string) {
	r := rand.New(rand.NewPCG(9, 9))
	pool = benchPool(r, 64<<20)
	systems = make([]string, 256)
	for i := range systems {
		off := r.IntN(len(pool) - 3072)
		systems[i] = pool[off : off+3072]
	}
	ws = testWorkers(b, 64)
	p = newTestCacheAware(b, LocalLoads{}, nil)
	for i := range treeBytes / 5120 {
		off := r.IntN(len(pool) - 5120)
		p.tree.Insert(systems[r.IntN(len(systems))]+pool[off:off+5120], ws[i%len(ws)].ID)
	}
	for _, s := range p.TreeSizes() {
		p.cfg.MaxTreeSize = max(p.cfg.MaxTreeSize, int(s))
	}
	return p, ws, systems, pool
}

// BenchmarkCacheAwareDecisionVsDecode times one cache_aware decision for an 8 KB prompt against
// a tree holding 100 MB of text for 64 workers, interleaved with decoding the same request body
// with encoding/json, and reports the ratio (target ≤ 0.25). Each request is new (a shared
// system prompt and a fresh 5 KB tail that the decision records), and the tree is kept at its
// size by an untimed Evict every 256 decisions, as the eviction loop does in production.
//
//	go test -run XXX -bench DecisionVsDecode -benchtime 3000x ./internal/policy/
func BenchmarkCacheAwareDecisionVsDecode(b *testing.B) {
	p, ws, systems, pool := bigTree(b, 100<<20)
	r := rand.New(rand.NewPCG(10, 10))
	var pickD, decodeD time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		if n++; n%256 == 0 {
			p.Evict()
			runtime.GC() // recycle what eviction freed, as a long-running gateway does
		}
		sys := systems[r.IntN(len(systems))]
		off := r.IntN(len(pool) - 5120)
		user := pool[off : off+5120]
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 64, "messages": []map[string]string{
			{"role": "system", "content": sys}, {"role": "user", "content": user},
		}})
		req := &Request{Model: "m", Text: sys + user}
		b.StartTimer()
		t0 := time.Now()
		if p.Pick(context.Background(), ws, req) == nil {
			b.Fatal("no pick")
		}
		t1 := time.Now()
		var cb chatBody
		if err := json.Unmarshal(body, &cb); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		pickD += t1.Sub(t0)
		decodeD += t2.Sub(t1)
	}
	b.ReportMetric(float64(pickD.Nanoseconds())/float64(b.N), "decision-ns")
	b.ReportMetric(float64(decodeD.Nanoseconds())/float64(b.N), "decode-ns")
	b.ReportMetric(float64(pickD)/float64(decodeD), "decision/decode")
	if d := p.Decisions(); d[BranchCacheHit] == 0 {
		b.Fatalf("no cache hits: %v", d)
	}
}

// BenchmarkCacheAwareScaling measures routing throughput with GOMAXPROCS=2 against GOMAXPROCS=1
// (target ≥ 1.6×). Rounds alternate between the two settings; each round routes the same number
// of requests from two goroutines. Because other processes share this machine, the same rounds
// also time a pure-CPU loop: "machine-x" is the speedup the machine itself allowed, "route-x"
// the speedup of routing, and "route/machine" how much of the available speedup routing kept.
//
//	go test -run XXX -bench CacheAwareScaling -benchtime 20x ./internal/policy/
func BenchmarkCacheAwareScaling(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 11))
	pool := benchPool(r, 16<<20)
	ws := testWorkers(b, 16)
	p := newTestCacheAware(b, LocalLoads{}, nil)
	texts := make([]string, 8192)
	for i := range texts { // 64 system prompts of 2 KB, 64 sessions each, 1 KB tails
		off, sysOff := r.IntN(len(pool)-1024), (i%64)*2048
		texts[i] = pool[sysOff:sysOff+2048] + pool[off:off+1024]
		p.Pick(context.Background(), ws, &Request{Text: texts[i]})
	}
	const perRound = 20000
	route := func(g, n int) {
		for i := range n {
			p.Pick(context.Background(), ws, &Request{Text: texts[(g*7919+i*31)%len(texts)]})
		}
	}
	spin := func(_, n int) {
		x := uint64(1)
		for range n * 2000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		runtime.KeepAlive(x)
	}
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	var routeT, spinT [3]time.Duration
	for b.Loop() {
		for _, procs := range []int{1, 2} {
			runtime.GOMAXPROCS(procs)
			routeT[procs] += timeSplit(route, perRound)
			spinT[procs] += timeSplit(spin, perRound)
		}
	}
	b.ReportMetric(float64(routeT[1])/float64(routeT[2]), "route-x")
	b.ReportMetric(float64(spinT[1])/float64(spinT[2]), "machine-x")
	b.ReportMetric(float64(routeT[1])/float64(routeT[2])/(float64(spinT[1])/float64(spinT[2])), "route/machine")
	b.ReportMetric(float64(routeT[1].Nanoseconds())/float64(b.N*perRound), "ns/route@1")
}

// timeSplit runs work(g, n/2) on two goroutines and returns the wall time.
func timeSplit(work func(g, n int), n int) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(g, n/2)
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkPolicies compares one decision of each policy over 16 workers (-cpu 1,2 also shows
// parallel throughput).
func BenchmarkPolicies(b *testing.B) {
	r := rand.New(rand.NewPCG(12, 12))
	pool := benchPool(r, 4<<20)
	texts := make([]string, 1024)
	for i := range texts {
		off := r.IntN(len(pool) - 4096)
		texts[i] = pool[(i%16)*2048:(i%16)*2048+2048] + pool[off:off+2048]
	}
	for _, name := range []string{"cache_aware_hash", "least_load", "cache_aware", "prefix_hash", "consistent_hashing", "round_robin"} {
		b.Run(name, func(b *testing.B) {
			pol := newQuiet(b, name)
			ws := testWorkers(b, 16)
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(len(texts))
				for pb.Next() {
					i = (i + 1) % len(texts)
					pol.Pick(context.Background(), ws, &Request{Text: texts[i], Key: fmt.Sprint(i)})
				}
			})
		})
	}
}

// BenchmarkDefaultAt256Workers is one decision of the default policy over 256 workers on
// Mooncake-like prompts (one shared 2 KB opening, a 6 KB tail, the gateway's 8 KiB routing text),
// beside round_robin's in the same run, for the scale figures of docs/routing.md §11:
//
//	go test -run XXX -bench DefaultAt256Workers ./internal/policy/
func BenchmarkDefaultAt256Workers(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 13))
	pool := benchPool(r, 16<<20)
	ws := testWorkers(b, 256)
	texts := make([]string, 4096)
	for i := range texts {
		off := r.IntN(len(pool) - 6144)
		texts[i] = pool[:2048] + pool[off:off+6144]
	}
	for _, name := range []string{"round_robin", "cache_aware_hash"} {
		b.Run(name, func(b *testing.B) {
			p := newQuiet(b, name)
			for i := range texts { // warm the tree: every prompt seen once
				p.Pick(context.Background(), ws, &Request{Text: texts[i]})
			}
			i := 0
			for b.Loop() {
				p.Pick(context.Background(), ws, &Request{Text: texts[i%len(texts)]})
				i++
			}
		})
	}
}

// newQuiet returns the named policy over the default configuration with no background work.
func newQuiet(tb testing.TB, name string) Policy {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.NoBackground = true
	p, err := New(name, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}
