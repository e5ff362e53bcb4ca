package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// drain runs e until it is idle, bounded by steps, and returns every event.
func drain(t testing.TB, e *Engine, maxSteps int) []Event {
	t.Helper()
	var evs []Event
	for i := 0; ; i++ {
		at, ok := e.NextEvent()
		if !ok {
			return evs
		}
		if i == maxSteps {
			t.Fatalf("engine still busy after %d events", maxSteps)
		}
		evs = e.Advance(at, evs)
	}
}

// byKind returns the events of kind k for request id.
func find(evs []Event, k EventKind, id uint64) (Event, bool) {
	for _, ev := range evs {
		if ev.Kind == k && ev.ID == id {
			return ev, true
		}
	}
	return Event{}, false
}

func mustNew(t testing.TB, c Config) *Engine {
	t.Helper()
	e, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustSubmit(t testing.TB, e *Engine, now time.Duration, r Request) {
	t.Helper()
	if err := e.Submit(now, r); err != nil {
		t.Fatal(err)
	}
}

// text returns a deterministic prompt of n tokens that starts with seed's content.
func text(seed string, tokens int) string {
	var b strings.Builder
	for i := 0; b.Len() < tokens*BytesPerToken; i++ {
		fmt.Fprintf(&b, "%s-%06d ", seed, i)
	}
	return b.String()[:tokens*BytesPerToken]
}

func TestSingleRequestTimings(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	mustSubmit(t, e, 0, Request{ID: 1, Text: text("a", 800), MaxTokens: 10})
	evs := drain(t, e, 1000)
	ft, ok := find(evs, FirstToken, 1)
	if !ok {
		t.Fatal("no first token")
	}
	// 800 uncached tokens: prefill in one 2048-token chunk at 8000 tok/s = 100 ms.
	if want := 100 * time.Millisecond; ft.TTFT != want {
		t.Errorf("TTFT = %v, want %v", ft.TTFT, want)
	}
	fin, _ := find(evs, Finished, 1)
	// 9 more tokens, each a decode step of 6 + 0.35 ms.
	if want := 100*time.Millisecond + 9*6350*time.Microsecond; fin.At != want {
		t.Errorf("finished at %v, want %v", fin.At, want)
	}
	if fin.CompletionTokens != 10 || fin.PromptTokens != 800 || fin.CachedTokens != 0 {
		t.Errorf("usage = %+v", fin)
	}
	if l := e.Load(); l.Running != 0 || l.Waiting != 0 || l.UsedTokens != 0 {
		t.Errorf("idle load = %+v", l)
	}
}

func TestChunkedPrefill(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	mustSubmit(t, e, 0, Request{ID: 1, Text: text("a", 5000), MaxTokens: 1})
	evs := drain(t, e, 1000)
	ft, _ := find(evs, FirstToken, 1)
	// Three chunks: 2048/8000 + 2048/8000 + 904/8000 s.
	want := time.Duration(float64(2048)/8000*1e9)*2 + time.Duration(float64(904)/8000*1e9)
	if ft.TTFT != want {
		t.Errorf("TTFT = %v, want %v", ft.TTFT, want)
	}
}

func TestRepeatedPromptTTFTFallsWithCachedShare(t *testing.T) {
	for _, shared := range []float64{0, 0.25, 0.5, 0.9} {
		t.Run(fmt.Sprint(shared), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DecodeBase, cfg.DecodePerReq = time.Microsecond, time.Microsecond // prefill dominates
			e := mustNew(t, cfg)
			const n = 1600
			base := text("shared", n)
			keep := int(shared*n) / 16 * 16 // whole blocks
			second := base[:keep*BytesPerToken] + text("other", n-keep)
			mustSubmit(t, e, 0, Request{ID: 1, Text: base, MaxTokens: 1})
			evs := drain(t, e, 100)
			first, _ := find(evs, FirstToken, 1)
			now := e.Now() + time.Second
			mustSubmit(t, e, now, Request{ID: 2, Text: second, MaxTokens: 1})
			evs = drain(t, e, 100)
			sec, _ := find(evs, FirstToken, 2)
			fin, _ := find(evs, Finished, 2)
			if fin.CachedTokens != keep {
				t.Fatalf("cached = %d, want %d", fin.CachedTokens, keep)
			}
			ratio := float64(sec.TTFT) / float64(first.TTFT)
			if want := 1 - float64(keep)/n; math.Abs(ratio-want) > 0.01 {
				t.Errorf("second/first TTFT = %.3f, want %.3f (uncached share)", ratio, want)
			}
		})
	}
}

func TestFullyCachedPromptComputesLastToken(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	p := text("x", 320)
	mustSubmit(t, e, 0, Request{ID: 1, Text: p, MaxTokens: 1})
	drain(t, e, 100)
	mustSubmit(t, e, time.Second, Request{ID: 2, Text: p, MaxTokens: 1})
	evs := drain(t, e, 100)
	fin, _ := find(evs, Finished, 2)
	if fin.CachedTokens != 319 {
		t.Errorf("cached = %d, want 319", fin.CachedTokens)
	}
}

func TestITLRisesWithBatchSize(t *testing.T) {
	itl := func(batch int) time.Duration {
		e := mustNew(t, DefaultConfig())
		for i := range batch {
			mustSubmit(t, e, 0, Request{ID: uint64(i), Text: text(fmt.Sprint(i), 8), MaxTokens: 50})
		}
		evs := drain(t, e, 100000)
		ft, _ := find(evs, FirstToken, 0)
		fin, _ := find(evs, Finished, 0)
		return (fin.At - (ft.TTFT)) / 49
	}
	prev := time.Duration(0)
	for _, b := range []int{1, 8, 64, 200} {
		got := itl(b)
		want := 6*time.Millisecond + time.Duration(b)*350*time.Microsecond
		if got != want {
			t.Errorf("batch %d: ITL %v, want %v", b, got, want)
		}
		if got <= prev {
			t.Errorf("batch %d: ITL %v did not rise from %v", b, got, prev)
		}
		prev = got
	}
}

func TestMaxRunningQueues(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxRunning = 2
	e := mustNew(t, cfg)
	for i := range 3 {
		mustSubmit(t, e, 0, Request{ID: uint64(i), Text: text(fmt.Sprint(i), 32), MaxTokens: 5})
	}
	e.Advance(0, nil)
	if l := e.Load(); l.Running != 2 || l.Waiting != 1 || l.WaitingUncachedTokens != 32 {
		t.Fatalf("load = %+v, want 2 running, 1 waiting with 32 uncached tokens", l)
	}
	evs := drain(t, e, 1000)
	a0, _ := find(evs, Finished, 0)
	a2, _ := find(evs, Admitted, 2)
	if a2.At != a0.At {
		t.Errorf("third admitted at %v, want when the first finished (%v)", a2.At, a0.At)
	}
}

func TestFullKVCacheMakesRequestsWait(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVTokens = 1024
	e := mustNew(t, cfg)
	long := text("long", 800)
	mustSubmit(t, e, 0, Request{ID: 1, Text: long, MaxTokens: 100})
	mustSubmit(t, e, time.Millisecond, Request{ID: 2, Text: text("other", 300), MaxTokens: 10})
	var evs []Event
	evs = e.Advance(200*time.Millisecond, evs)
	l := e.Load()
	if l.Running != 1 || l.Waiting != 1 {
		t.Fatalf("load = %+v, want 1 running and 1 waiting", l)
	}
	// The running request's blocks are pinned: flushing keeps them.
	if got := e.FlushCache(e.Now()); got != 0 {
		t.Errorf("flush dropped %d tokens of a running request", got)
	}
	evs = append(evs, drain(t, e, 10000)...)
	f1, _ := find(evs, Finished, 1)
	a2, _ := find(evs, Admitted, 2)
	if a2.At < f1.At {
		t.Errorf("request 2 admitted at %v, before request 1 freed the cache at %v", a2.At, f1.At)
	}
	// Request 2 evicted request 1's cached prompt (LRU) to fit; a rerun of request 1 now misses
	// its tail.
	mustSubmit(t, e, e.Now(), Request{ID: 3, Text: long, MaxTokens: 1})
	evs = drain(t, e, 1000)
	if fin, _ := find(evs, Finished, 3); fin.CachedTokens >= 799 {
		t.Errorf("request 3 cached %d tokens; request 2 should have evicted part of them", fin.CachedTokens)
	}
}

func TestEvictionIsLeastRecentlyUsed(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVTokens = 64 * 16 // 64 blocks
	e := mustNew(t, cfg)
	a, b := text("a", 320), text("b", 320) // 20 blocks each
	run := func(id uint64, p string) Event {
		mustSubmit(t, e, e.Now()+time.Second, Request{ID: id, Text: p, MaxTokens: 1})
		fin, _ := find(drain(t, e, 1000), Finished, id)
		return fin
	}
	run(1, a)
	run(2, b)
	run(3, a)              // a is now more recent than b
	run(4, text("d", 704)) // 44 blocks: the 24 free ones and all 20 of b's
	if got := run(5, a).CachedTokens; got != 319 {
		t.Errorf("a cached %d, want 319: the most recent prompt must survive", got)
	}
	if got := run(6, b).CachedTokens; got != 0 {
		t.Errorf("b cached %d, want 0: its tail was evicted, so no prefix of it matches", got)
	}
}

func TestAbortFreesKV(t *testing.T) {
	for _, at := range []time.Duration{0, 50 * time.Millisecond, 500 * time.Millisecond} {
		t.Run(at.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxRunning = 1
			e := mustNew(t, cfg)
			mustSubmit(t, e, 0, Request{ID: 1, Text: text("a", 1000), MaxTokens: 1000})
			mustSubmit(t, e, 0, Request{ID: 2, Text: text("b", 100), MaxTokens: 1})
			evs := e.Advance(at, nil)
			if !e.Abort(at, 1) {
				t.Fatal("abort of a live request reported false")
			}
			if e.Abort(at, 1) {
				t.Error("second abort reported true")
			}
			evs = e.Advance(at, evs)
			if l := e.Load(); l.Running > 1 || l.UsedTokens > 112 {
				t.Errorf("after abort: %+v", l)
			}
			evs = append(evs, drain(t, e, 1000)...)
			if _, ok := find(evs, Finished, 1); ok {
				t.Error("aborted request finished")
			}
			if fin, ok := find(evs, Finished, 2); !ok || fin.At > at+140*time.Millisecond {
				t.Errorf("request 2 finished %v at %v, want soon after the abort", ok, fin.At)
			}
		})
	}
}

func TestPreemptionWhenDecodeOutgrowsCache(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVTokens = 40 * 16
	e := mustNew(t, cfg)
	// Both prompts fit (15 blocks each), but their 150 output tokens each do not.
	mustSubmit(t, e, 0, Request{ID: 1, Text: text("a", 240), MaxTokens: 150})
	mustSubmit(t, e, 0, Request{ID: 2, Text: text("b", 240), MaxTokens: 150})
	evs := drain(t, e, 100000)
	for id := uint64(1); id <= 2; id++ {
		if fin, ok := find(evs, Finished, id); !ok || fin.CompletionTokens != 150 {
			t.Errorf("request %d: finished %v %+v", id, ok, fin)
		}
	}
	if l := e.Load(); l.Preemptions == 0 || l.UsedTokens != 0 {
		t.Errorf("load = %+v, want a preemption and an empty cache", l)
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVTokens = 1024
	e := mustNew(t, cfg)
	mustSubmit(t, e, 0, Request{ID: 1, Text: "hello", MaxTokens: 1})
	for _, tc := range []struct {
		name string
		r    Request
		want error
	}{
		{"duplicate", Request{ID: 1, Text: "x", MaxTokens: 1}, ErrDuplicateID},
		{"empty", Request{ID: 2, MaxTokens: 1}, ErrEmptyPrompt},
		{"empty tokens", Request{ID: 2, Tokens: []uint32{}, MaxTokens: 1}, ErrEmptyPrompt},
		{"max tokens", Request{ID: 2, Text: "x", MaxTokens: 0}, ErrMaxTokens},
		{"too long", Request{ID: 2, Text: text("x", 1000), MaxTokens: 100}, ErrTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Submit(0, tc.r); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"zero is defaults", func(c *Config) { *c = Config{} }, true},
		{"negative block", func(c *Config) { c.BlockSize = -1 }, false},
		{"kv below a block", func(c *Config) { c.KVTokens = 8 }, false},
		{"negative running", func(c *Config) { c.MaxRunning = -1 }, false},
		{"negative chunk", func(c *Config) { c.PrefillChunk = -5 }, false},
		{"NaN tps", func(c *Config) { c.PrefillTPS = math.NaN() }, false},
		{"negative decode", func(c *Config) { c.DecodeBase = -time.Millisecond }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			if err := c.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestDecodeStall: a step lasts max(decode cost, prefill time); the time by which a prefill
// chunk stretches a step that has decoding requests is counted as decode stall, once per step
// however many decoding requests it holds up.
func TestDecodeStall(t *testing.T) {
	e := mustNew(t, Config{})
	for i := range 2 {
		mustSubmit(t, e, 0, Request{ID: uint64(i + 1), Text: text(fmt.Sprint(i), 8), MaxTokens: 200})
	}
	e.Advance(100*time.Millisecond, nil) // both decoding, nothing stretched
	if l := e.Load(); l.DecodeStall != 0 {
		t.Fatalf("stall %v before any long prefill", l.DecodeStall)
	}
	mustSubmit(t, e, 100*time.Millisecond, Request{ID: 3, Text: text("long", 1600), MaxTokens: 1})
	drain(t, e, 10000)
	// One step carries the 1,600-token prefill: 200 ms at 8,000 tokens/s against a decode cost of
	// 6 + 2 × 0.35 ms, so the step runs 193.3 ms past its decode cost.
	want := 200*time.Millisecond - 6700*time.Microsecond
	l := e.Load()
	if d := l.DecodeStall - want; d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("decode stall %v, want %v", l.DecodeStall, want)
	}
}
