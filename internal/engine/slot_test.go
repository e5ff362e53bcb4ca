package engine

import (
	"testing"
	"time"
)

// tokens returns n distinct prompt tokens that start at base, so that prompts with different
// bases share no block.
func tokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// ttfts runs the requests, all submitted at time 0 in order, to the end and returns each one's
// TTFT and finish time by id.
func ttfts(t *testing.T, cfg Config, reqs ...Request) (ttft, done map[uint64]time.Duration) {
	t.Helper()
	e := mustNew(t, cfg)
	for _, r := range reqs {
		mustSubmit(t, e, 0, r)
	}
	ttft, done = map[uint64]time.Duration{}, map[uint64]time.Duration{}
	for _, ev := range drain(t, e, 10000) {
		switch ev.Kind {
		case FirstToken:
			ttft[ev.ID] = ev.TTFT
		case Finished:
			done[ev.ID] = ev.At
		}
	}
	return ttft, done
}

func near(a, b time.Duration) bool { return a-b < time.Microsecond && b-a < time.Microsecond }

// TestTimingModelsTTFT pins the TTFT of a 4000-token and an 800-token prompt submitted together
// under each timing model, computed by hand from the model's formulas.
func TestTimingModelsTTFT(t *testing.T) {
	base := Config{MaxRunning: 8, PrefillChunk: 2048, PrefillTPS: 8000, DecodeBase: 6 * time.Millisecond, DecodePerReq: 500 * time.Microsecond}
	a := Request{ID: 1, Tokens: tokens(0, 4000), MaxTokens: 4}
	b := Request{ID: 2, Tokens: tokens(1_000_000, 800), MaxTokens: 4}
	for _, tc := range []struct {
		name     string
		timing   TimingModel
		overhead time.Duration
		factor   float64
		a, b     time.Duration
	}{
		// Step 1 prefills 2048 of A's tokens (256 ms); step 2 A's last 1952 and B's first 96
		// (256 ms): A's first token at 512 ms. Step 3 B's last 704 tokens (88 ms, longer than
		// A's 6.5 ms decode): B's at 600 ms.
		{"batched", TimingBatched, 0, 1, 512 * time.Millisecond, 600 * time.Millisecond},
		// The batched model ignores the per-slot knobs.
		{"batched ignores per-slot knobs", TimingBatched, 20 * time.Millisecond, 3, 512 * time.Millisecond, 600 * time.Millisecond},
		// Each slot on its own: 4000/8000 s and 800/8000 s.
		{"per-slot", TimingPerSlot, 0, 1, 500 * time.Millisecond, 100 * time.Millisecond},
		// Plus 20 ms each.
		{"per-slot overhead", TimingPerSlot, 20 * time.Millisecond, 1, 520 * time.Millisecond, 120 * time.Millisecond},
		// A is admitted alone (factor 1); B second of 8 slots: 1 + (2−1)·1/7 = 8/7.
		{"per-slot load factor", TimingPerSlot, 0, 2, 500 * time.Millisecond, 100 * time.Millisecond * 8 / 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Timing, cfg.PrefillOverhead, cfg.LoadFactor = tc.timing, tc.overhead, tc.factor
			got, _ := ttfts(t, cfg, a, b)
			if !near(got[1], tc.a) || !near(got[2], tc.b) {
				t.Errorf("TTFT A %v, B %v; want %v, %v", got[1], got[2], tc.a, tc.b)
			}
		})
	}
}

// TestPerSlotQueueing: with one slot, B waits until A's last token; A decodes every DecodeBase.
func TestPerSlotQueueing(t *testing.T) {
	cfg := Config{MaxRunning: 1, PrefillTPS: 8000, DecodeBase: 6 * time.Millisecond, DecodePerReq: time.Millisecond,
		Timing: TimingPerSlot, LoadFactor: 4}
	ttft, done := ttfts(t, cfg,
		Request{ID: 1, Tokens: tokens(0, 4000), MaxTokens: 3},
		Request{ID: 2, Tokens: tokens(1_000_000, 800), MaxTokens: 1})
	// A: 500 ms of prefill, then 2 tokens 6 ms apart (one slot: no load factor, no per-request
	// decode cost). B is admitted at 512 ms and prefills for 100 ms.
	want := map[uint64]time.Duration{1: 500 * time.Millisecond, 2: 612 * time.Millisecond}
	wantDone := map[uint64]time.Duration{1: 512 * time.Millisecond, 2: 612 * time.Millisecond}
	for id := range want {
		if !near(ttft[id], want[id]) || !near(done[id], wantDone[id]) {
			t.Errorf("request %d: TTFT %v, finished at %v; want %v, %v", id, ttft[id], done[id], want[id], wantDone[id])
		}
	}
}

// TestPerSlotPrefixCache: a repeated prompt prefills only its last token.
func TestPerSlotPrefixCache(t *testing.T) {
	cfg := Config{PrefillTPS: 8000, Timing: TimingPerSlot}
	e := mustNew(t, cfg)
	p := tokens(0, 4000)
	mustSubmit(t, e, 0, Request{ID: 1, Tokens: p, MaxTokens: 2})
	drain(t, e, 100)
	now := e.Now()
	mustSubmit(t, e, now, Request{ID: 2, Tokens: p, MaxTokens: 1})
	ft, ok := find(drain(t, e, 100), FirstToken, 2)
	if !ok || !near(ft.TTFT, time.Second/8000) {
		t.Fatalf("repeated prompt TTFT %v (found %v), want %v", ft.TTFT, ok, time.Second/8000)
	}
}

// TestPerSlotLoadReportsPrefillLeft: half-way through a prefill, half its tokens are reported
// as prefill work ahead.
func TestPerSlotLoadReportsPrefillLeft(t *testing.T) {
	e := mustNew(t, Config{PrefillTPS: 8000, Timing: TimingPerSlot})
	mustSubmit(t, e, 0, Request{ID: 1, Tokens: tokens(0, 4000), MaxTokens: 2})
	e.Advance(250*time.Millisecond, nil)
	if l := e.Load(); l.Running != 1 || l.PrefillTokens != 2000 {
		t.Fatalf("load half-way through the prefill: running %d, prefill tokens %d; want 1, 2000", l.Running, l.PrefillTokens)
	}
}

func TestParseTimingModel(t *testing.T) {
	for in, want := range map[string]TimingModel{"": TimingBatched, "batched": TimingBatched, "per-slot": TimingPerSlot, "Per_Slot": TimingPerSlot} {
		if got, err := ParseTimingModel(in); err != nil || got != want {
			t.Errorf("ParseTimingModel(%q) = %v, %v; want %v", in, got, err, want)
		}
		if want.String() == "" {
			t.Errorf("%d has no name", want)
		}
	}
	if _, err := ParseTimingModel("chunked"); err == nil {
		t.Error("ParseTimingModel accepted an unknown model")
	}
	for _, c := range []Config{{Timing: 7}, {LoadFactor: 0.5}, {LoadFactor: 101}, {PrefillOverhead: -1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", c)
		}
	}
}
