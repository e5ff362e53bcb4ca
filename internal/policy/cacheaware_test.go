package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// testWorkers returns n ready workers.
func testWorkers(t testing.TB, n int) []*worker.Worker {
	t.Helper()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://10.0.0.%d:8000", i+1)}, worker.BreakerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		ws[i] = w
	}
	return ws
}

// fakeLoads is a Loads whose values tests set per worker. Safe for concurrent use.
type fakeLoads struct {
	mu      sync.Mutex
	load    map[*worker.Worker]int64
	reports map[*worker.Worker]loadmon.Report
}

func newFakeLoads() *fakeLoads {
	return &fakeLoads{load: map[*worker.Worker]int64{}, reports: map[*worker.Worker]loadmon.Report{}}
}

func (f *fakeLoads) set(w *worker.Worker, l int64) {
	f.mu.Lock()
	f.load[w] = l
	f.mu.Unlock()
}

func (f *fakeLoads) Load(w *worker.Worker) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.load[w]
}

func (f *fakeLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reports[w]
	return r, ok
}

func newTestCacheAware(t testing.TB, loads Loads, tweak func(*CacheAwareConfig)) *CacheAware {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Loads = loads
	cfg.NoBackground = true
	if tweak != nil {
		tweak(&cfg.CacheAware)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return NewCacheAware(cfg)
}

const sys = "You are a helpful assistant. Answer briefly and cite your sources. "

func TestCacheAwareBranches(t *testing.T) {
	tests := []struct {
		name      string
		loads     []int64
		usage     []float64 // KV token usage per worker; nil: no reports
		processed []int     // requests already finished per worker
		down      []int     // unavailable workers
		held      map[int]string
		tweak     func(*CacheAwareConfig)
		text      string
		want      int // -1: nil
		branch    string
	}{
		{name: "no worker available", loads: []int64{0, 0}, down: []int{0, 1}, text: "x", want: -1},
		{name: "empty tree: least loaded", loads: []int64{5, 2, 9}, text: sys + "q1", want: 1, branch: BranchCacheMiss},
		{name: "tie on load: fewest processed", loads: []int64{3, 3, 3}, processed: []int{4, 1, 2}, text: "q", want: 1, branch: BranchCacheMiss},
		{name: "tie on load and processed: lowest index", loads: []int64{3, 3, 3}, text: "q", want: 0, branch: BranchCacheMiss},
		{name: "empty text: least loaded", loads: []int64{1, 0}, held: map[int]string{0: sys}, text: "", want: 1, branch: BranchCacheMiss},
		{name: "hit: the holder wins over the least loaded", loads: []int64{0, 10, 4}, held: map[int]string{2: sys + "old"}, text: sys + "new", want: 2, branch: BranchCacheHit},
		{name: "hit: least loaded of several holders", loads: []int64{0, 9, 4, 6}, held: map[int]string{1: sys, 2: sys, 3: sys}, text: sys + "new", want: 2, branch: BranchCacheHit},
		{name: "match at threshold is a miss", loads: []int64{0, 5}, held: map[int]string{1: "abc"}, tweak: func(c *CacheAwareConfig) { c.CacheThreshold = 0.5 }, text: "abcdef", want: 0, branch: BranchCacheMiss},
		{name: "short match is a miss", loads: []int64{0, 5}, held: map[int]string{1: "You are"}, text: sys + "new", want: 0, branch: BranchCacheMiss},
		{name: "holder unavailable: miss", loads: []int64{3, 0, 1}, held: map[int]string{1: sys}, down: []int{1}, text: sys + "x", want: 2, branch: BranchCacheMiss},
		{name: "imbalanced: least loaded despite a hit", loads: []int64{100, 10, 30}, held: map[int]string{0: sys}, text: sys + "x", want: 1, branch: BranchImbalanced},
		{name: "abs exceeded but not rel: affinity", loads: []int64{300, 220}, held: map[int]string{0: sys}, text: sys + "x", want: 0, branch: BranchCacheHit},
		{name: "rel exceeded but not abs: affinity", loads: []int64{60, 0}, held: map[int]string{0: sys}, text: sys + "x", want: 0, branch: BranchCacheHit},
		{name: "KV triggers off by default", loads: []int64{2, 1}, usage: []float64{0.99, 0.01}, held: map[int]string{0: sys}, text: sys + "x", want: 0, branch: BranchCacheHit},
		{name: "KV overload trigger", loads: []int64{2, 1}, usage: []float64{0.95, 0.9}, held: map[int]string{0: sys}, tweak: func(c *CacheAwareConfig) { c.OverloadTokenUsageThreshold = 0.92 }, text: sys + "x", want: 1, branch: BranchImbalanced},
		{name: "KV spread trigger", loads: []int64{2, 1}, usage: []float64{0.7, 0.2}, held: map[int]string{0: sys}, tweak: func(c *CacheAwareConfig) { c.BalanceTokenUsageThreshold = 0.4 }, text: sys + "x", want: 1, branch: BranchImbalanced},
		{name: "KV within thresholds: affinity", loads: []int64{2, 1}, usage: []float64{0.5, 0.3}, held: map[int]string{0: sys}, tweak: func(c *CacheAwareConfig) { c.BalanceTokenUsageThreshold = 0.4; c.OverloadTokenUsageThreshold = 0.9 }, text: sys + "x", want: 0, branch: BranchCacheHit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, len(tt.loads))
			loads := newFakeLoads()
			for i, l := range tt.loads {
				loads.set(ws[i], l)
			}
			for i, u := range tt.usage {
				loads.reports[ws[i]] = loadmon.Report{TokenUsage: u, HasTokenData: true}
			}
			for i, n := range tt.processed {
				for range n {
					ws[i].Acquire()()
				}
			}
			for _, i := range tt.down {
				ws[i].SetHealth(worker.NotReady)
			}
			p := newTestCacheAware(t, loads, tt.tweak)
			for i, s := range tt.held {
				p.tree.Insert(s, ws[i].ID)
			}
			got := p.Pick(context.Background(), ws, &Request{Text: tt.text})
			if tt.want < 0 {
				if got != nil {
					t.Fatalf("Pick = %s, want nil", got.ID)
				}
				return
			}
			if got != ws[tt.want] {
				t.Fatalf("Pick = %v, want worker %d", got, tt.want)
			}
			for b, n := range p.Decisions() {
				if want := map[bool]uint64{true: 1}[b == tt.branch]; n != want {
					t.Fatalf("Decisions()[%s] = %d, want %d (all: %v)", b, n, want, p.Decisions())
				}
			}
			if tt.text != "" {
				if n, ts := p.tree.Lookup(tt.text); n != len(tt.text) || !contains(ts, got.ID) {
					t.Fatalf("text not recorded for the chosen worker: %d chars, tenants %v", n, ts)
				}
			}
		})
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestCacheAwareAffinityAcrossRequests(t *testing.T) {
	ws := testWorkers(t, 3)
	loads := newFakeLoads()
	p := newTestCacheAware(t, loads, nil)
	first := p.Pick(context.Background(), ws, &Request{Text: sys + "first question"})
	for _, w := range ws { // the first worker is now the busiest, but still within balance
		if w != first {
			loads.set(w, 0)
		} else {
			loads.set(w, 10)
		}
	}
	if got := p.Pick(context.Background(), ws, &Request{Text: sys + "second question"}); got != first {
		t.Fatalf("follow-up went to %s, want the holder %s", got.ID, first.ID)
	}
	if sizes := p.TreeSizes(); sizes[first.ID] != int64(len(sys+"first question")+len("second question")) {
		t.Fatalf("TreeSizes = %v", sizes)
	}
}

func TestCacheAwareForget(t *testing.T) {
	ws := testWorkers(t, 2)
	loads := newFakeLoads()
	loads.set(ws[0], 5)
	p := newTestCacheAware(t, loads, nil)
	p.tree.Insert(sys, ws[0].ID)
	p.Forget(ws[0].ID)
	if got := p.Pick(context.Background(), ws, &Request{Text: sys + "x"}); got != ws[1] {
		t.Fatalf("Pick after Forget = %s, want the least loaded", got.ID)
	}
	if _, ok := p.TreeSizes()[ws[0].ID]; ok {
		t.Fatal("forgotten worker still has a tree size")
	}
}

func TestCacheAwareEvictLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.CacheAware.EvictionInterval = time.Minute
		cfg.CacheAware.MaxTreeSize = 10
		p := NewCacheAware(cfg)
		defer p.Close()
		ws := testWorkers(t, 1)
		p.Pick(context.Background(), ws, &Request{Text: strings.Repeat("a", 100)})
		time.Sleep(59 * time.Second) // virtual time: the bubble's clock
		synctest.Wait()
		if s := p.TreeSizes()[ws[0].ID]; s != 100 {
			t.Fatalf("evicted before the interval: size %d", s)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s := p.TreeSizes()[ws[0].ID]; s != 0 {
			t.Fatalf("size %d after the eviction interval, cap 10", s)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRouterBuildsAndClosesCacheAware(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, alias := range []string{"cache_aware", "cacheaware", "cache-aware"} {
			if c, err := Canonical(alias); err != nil || c != "cache_aware" {
				t.Fatalf("Canonical(%q) = %q, %v", alias, c, err)
			}
		}
		if !LoadAware("cache_aware") || !LoadAware("prefix_hash") || LoadAware("consistent_hashing") {
			t.Fatal("wrong loadAware flags")
		}
		r, err := NewRouter("cache-aware", DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"a", "b"} {
			if p, err := r.For(m, worker.Regular); err != nil || p.Name() != "cache_aware" {
				t.Fatalf("For(%s) = %v, %v", m, p, err)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		// synctest fails the test if an eviction goroutine outlived Close.
	})
}

// TestCacheAwareConcurrent routes from many goroutines while loads change, workers are forgotten
// and the tree is evicted; the race detector checks the sharing.
func TestCacheAwareConcurrent(t *testing.T) {
	ws := testWorkers(t, 8)
	loads := newFakeLoads()
	p := newTestCacheAware(t, loads, func(c *CacheAwareConfig) { c.MaxTreeSize = 5000 })
	var picks atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for i := range 1500 {
				switch {
				case g == 0 && i%100 == 0:
					p.Evict()
				case g == 1 && i%300 == 0:
					p.Forget(ws[r.IntN(len(ws))].ID)
				case g == 2 && i%10 == 0:
					loads.set(ws[r.IntN(len(ws))], int64(r.IntN(100)))
				default:
					text := fmt.Sprintf("%s session %d turn %d", sys, r.IntN(50), r.IntN(5))
					if p.Pick(context.Background(), ws, &Request{Text: text}) == nil {
						t.Error("nil pick with available workers")
						return
					}
					picks.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	var total uint64
	for _, n := range p.Decisions() {
		total += n
	}
	if total != uint64(picks.Load()) {
		t.Fatalf("decisions %d, picks %d", total, picks.Load())
	}
	p.Evict()
	for id, s := range p.TreeSizes() {
		if s > 5000 {
			t.Fatalf("%s holds %d after eviction, cap 5000", id, s)
		}
	}
}
