package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// workload submits a seeded random workload of n requests sharing a few prefixes, advancing the
// engine event by event, and returns every event.
func workload(t testing.TB, cfg Config, seed uint64, n int) []Event {
	t.Helper()
	e := mustNew(t, cfg)
	rng := rand.New(rand.NewPCG(seed, 1))
	var evs []Event
	now := time.Duration(0)
	for i := range n {
		now += time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond))
		for {
			at, ok := e.NextEvent()
			if !ok || at > now {
				break
			}
			evs = e.Advance(at, evs)
		}
		p := text(fmt.Sprint("sys", rng.IntN(4)), 200+rng.IntN(200)) + text(fmt.Sprint("u", i), 16+rng.IntN(100))
		mustSubmit(t, e, now, Request{ID: uint64(i), Text: p, MaxTokens: 1 + rng.IntN(64)})
		if rng.IntN(20) == 0 {
			e.Abort(now, uint64(rng.IntN(i+1)))
		}
	}
	return append(evs, drain(t, e, 1_000_000)...)
}

func TestSameInputsSameTimings(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVTokens = 8192 // small enough to evict and preempt
	a := workload(t, cfg, 7, 300)
	b := workload(t, cfg, 7, 300)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of the same workload gave different events")
	}
	if c := workload(t, cfg, 8, 300); reflect.DeepEqual(a, c) {
		t.Fatal("different seeds gave the same events; the test workload is not random")
	}
}

// TestFastModeMatchesTokenMode checks that decode runs change nothing but the events reported.
func TestFastModeMatchesTokenMode(t *testing.T) {
	for i, kv := range []int{8192, 524288, 8192} {
		timing := TimingModel(i / 2) // the last one per-slot
		t.Run(fmt.Sprint(timing, kv), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.KVTokens, cfg.Timing, cfg.LoadFactor = kv, timing, 2
			fast := workload(t, cfg, 3, 300)
			cfg.EmitTokens = true
			slow := workload(t, cfg, 3, 300)
			tokens := map[uint64]int{}
			var kept []Event
			for _, ev := range slow {
				switch ev.Kind {
				case Tokens:
					tokens[ev.ID] += ev.Tokens
				case FirstToken:
					tokens[ev.ID]++
					kept = append(kept, ev)
				case Finished:
					if tokens[ev.ID] != ev.CompletionTokens {
						t.Errorf("request %d: %d tokens streamed, %d reported", ev.ID, tokens[ev.ID], ev.CompletionTokens)
					}
					kept = append(kept, ev)
				default:
					kept = append(kept, ev)
				}
			}
			if !reflect.DeepEqual(fast, kept) {
				t.Fatalf("fast mode diverged from token mode: %d vs %d events", len(fast), len(kept))
			}
		})
	}
}

func TestLoadStatistics(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	p := text("p", 1600)
	mustSubmit(t, e, 0, Request{ID: 1, Text: p, MaxTokens: 100})
	mustSubmit(t, e, 0, Request{ID: 2, Text: text("q", 400), MaxTokens: 100})
	e.Advance(300*time.Millisecond, nil)
	l := e.Load()
	if l.Running != 2 || l.UsedTokens < 2000 || l.TokenUsage <= 0 || l.GenThroughput <= 0 {
		t.Errorf("busy load = %+v", l)
	}
	drain(t, e, 10000)
	mustSubmit(t, e, e.Now(), Request{ID: 3, Text: p, MaxTokens: 1})
	drain(t, e, 10000)
	l = e.Load()
	// Token-weighted: 1599 hits over 1600+400+1600 prompt tokens, the first two decayed a little
	// (the third came under a second later, with a 10 s window).
	if want := 1599.0 / 3600; l.CacheHitRate < want || l.CacheHitRate > want*1.1 {
		t.Errorf("cache hit rate = %v, want about %v", l.CacheHitRate, want)
	}
	if l.PromptTokens != 3600 || l.CachedTokens != 1599 || l.GeneratedTokens != 201 || l.Finished != 3 {
		t.Errorf("counters = %+v", l)
	}
	e.Advance(e.Now()+time.Minute, nil)
	if l := e.Load(); l.GenThroughput > 1 {
		t.Errorf("gen throughput %v a minute after the last token, want about 0", l.GenThroughput)
	}
}

// TestCacheInvariants runs random workloads on a tiny cache and checks the block accounting
// after every event.
func TestCacheInvariants(t *testing.T) {
	for seed := range uint64(6) {
		timing := TimingModel(seed % 2)
		t.Run(fmt.Sprint(timing, seed), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.KVTokens, cfg.MaxRunning, cfg.Timing, cfg.LoadFactor = 2048, 8, timing, 2
			e := mustNew(t, cfg)
			rng := rand.New(rand.NewPCG(seed, 2))
			now := time.Duration(0)
			for i := range 400 {
				now += time.Duration(rng.IntN(int(30 * time.Millisecond)))
				e.Advance(now, nil)
				checkInvariants(t, e)
				p := text(fmt.Sprint("s", rng.IntN(3)), 100+rng.IntN(300))
				_ = e.Submit(now, Request{ID: uint64(i), Text: p, MaxTokens: 1 + rng.IntN(300)})
				if rng.IntN(10) == 0 {
					e.Abort(now, uint64(rng.IntN(i+1)))
				}
				checkInvariants(t, e)
			}
			drain(t, e, 1_000_000)
			checkInvariants(t, e)
			if l := e.Load(); l.UsedTokens != 0 || e.Live() != 0 {
				t.Errorf("idle engine holds %d tokens, %d requests", l.UsedTokens, e.Live())
			}
		})
	}
}

func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	c := e.cache
	held, refs := 0, map[blockID]int32{}
	for _, r := range e.running {
		held += r.priv
		for _, id := range r.pinned {
			refs[id]++
		}
		if r.priv < 0 {
			t.Fatalf("request %d holds %d private blocks", r.id, r.priv)
		}
	}
	for id, n := range refs {
		if b := c.slab[id]; b.ref != n || c.index.get(b.key) != id {
			t.Fatalf("block ref %d, pinned by %d requests (indexed %v)", b.ref, n, c.index.get(b.key) == id)
		}
	}
	lru := 0
	for id := c.slab[0].next; id != 0; id = c.slab[id].next {
		if b := c.slab[id]; b.ref != 0 || c.index.get(b.key) != id {
			t.Fatal("LRU list holds a pinned or unknown block")
		}
		lru++
	}
	if lru != c.lruLen || c.cached() != len(refs)+lru {
		t.Fatalf("lru %d/%d, cached %d, pinned %d", lru, c.lruLen, c.cached(), len(refs))
	}
	if c.free+held+c.cached() != c.total || c.free < 0 {
		t.Fatalf("free %d + private %d + cached %d != total %d", c.free, held, c.cached(), c.total)
	}
	if n := c.cached() + len(c.spare) + 1; n != len(c.slab) {
		t.Fatalf("cached %d + spare %d + sentinel != slab %d", c.cached(), len(c.spare), len(c.slab))
	}
	if len(e.running) > e.cfg.MaxRunning {
		t.Fatalf("%d running over the limit", len(e.running))
	}
	if e.cfg.Timing == TimingPerSlot {
		if len(e.slots) != len(e.running) {
			t.Fatalf("%d requests in the slot heap, %d running", len(e.slots), len(e.running))
		}
		for i, r := range e.slots {
			if r.slot != i || r.state != running || r.due < e.now {
				t.Fatalf("slot heap entry %d: index %d, state %d, due %v at %v", i, r.slot, r.state, r.due, e.now)
			}
		}
	}
}

// FuzzEngineOps drives a small engine with an arbitrary sequence of submits, aborts, flushes and
// time steps, checking the cache accounting after each and that every request ends.
func FuzzEngineOps(f *testing.F) {
	f.Add([]byte{0, 10, 20, 0, 11, 40, 2, 5, 1, 3, 0, 12, 200, 2, 255})
	f.Add([]byte{0, 1, 255, 0, 1, 255, 0, 2, 255, 2, 100, 1, 0, 3, 0})
	f.Add([]byte{128, 10, 20, 0, 11, 40, 2, 5, 1, 3, 0, 12, 200, 2, 255, 1, 2, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		cfg := DefaultConfig()
		cfg.KVTokens, cfg.MaxRunning, cfg.PrefillChunk = 1024, 4, 64
		if len(ops) > 0 && ops[0]&0x80 != 0 {
			cfg.Timing, cfg.LoadFactor = TimingPerSlot, 3
		}
		e := mustNew(t, cfg)
		now, id := time.Duration(0), uint64(0)
		for i := 0; i+2 < len(ops) && i < 300; i += 3 {
			a, b := int(ops[i+1]), int(ops[i+2])
			switch ops[i] % 4 {
			case 0:
				id++
				p := text(fmt.Sprint("s", a%3), 1+a*2) + text(fmt.Sprint(id), b%20)
				_ = e.Submit(now, Request{ID: id, Text: p, MaxTokens: 1 + b})
			case 1:
				e.Abort(now, uint64(a))
			case 2:
				now += time.Duration(a*b) * 100 * time.Microsecond
				e.Advance(now, nil)
			case 3:
				e.FlushCache(now)
			}
			checkInvariants(t, e)
		}
		drain(t, e, 1_000_000)
		checkInvariants(t, e)
		if e.Live() != 0 || e.Load().UsedTokens != 0 {
			t.Fatalf("idle engine holds %d requests, %d tokens", e.Live(), e.Load().UsedTokens)
		}
	})
}

// TestPrefillCounters: each request's time in prefill runs from the step that first schedules
// its prefill to its first token (vLLM's request_prefill_time_seconds), with its uncached
// tokens: one 4,096-token prompt alone prefills in two 2,048-token chunks at 8,000 tokens/s
// (0.512 s), and the same prompt again, all but its last token cached, in one step. A prompt
// admitted behind it is timed from its own first chunk, not from its admission, in both timing
// models.
func TestPrefillCounters(t *testing.T) {
	for _, timing := range []TimingModel{TimingBatched, TimingPerSlot} {
		cfg := DefaultConfig()
		cfg.Timing = timing
		e := mustNew(t, cfg)
		p := text("p", 4096)
		mustSubmit(t, e, 0, Request{ID: 1, Text: p, MaxTokens: 1})
		drain(t, e, 10000)
		l := e.Load()
		if l.PrefilledTokens != 4096 || math.Abs(l.PrefillSeconds-0.512) > 0.001 {
			t.Fatalf("%v: prefilled %d tokens in %.4f s, want 4096 in 0.512 s", timing, l.PrefilledTokens, l.PrefillSeconds)
		}
		mustSubmit(t, e, e.Now(), Request{ID: 2, Text: p, MaxTokens: 1})
		drain(t, e, 10000)
		l2 := e.Load()
		if got := l2.PrefilledTokens - l.PrefilledTokens; got != 1 {
			t.Fatalf("%v: the cached prompt added %d uncached tokens, want its last one", timing, got)
		}
		if got := l2.PrefillSeconds - l.PrefillSeconds; got <= 0 || got > 0.01 {
			t.Fatalf("%v: the cached prompt spent %.4f s in prefill, want one short step", timing, got)
		}
	}
}
