package engine

import (
	"slices"
	"testing"
	"time"
)

// With one adapter slot, a request for a second adapter waits while the first runs, and a
// base-model request queued behind it is admitted past it.
func TestLoraSlotWaitAndSkip(t *testing.T) {
	for _, timing := range []TimingModel{TimingBatched, TimingPerSlot} {
		t.Run(timing.String(), func(t *testing.T) {
			e := mustNew(t, Config{MaxLoras: 1, LoraLoad: 100 * time.Millisecond, Timing: timing})
			mustSubmit(t, e, 0, Request{ID: 1, Text: text("a", 64), MaxTokens: 50, Adapter: "a"})
			mustSubmit(t, e, 0, Request{ID: 2, Text: text("b", 64), MaxTokens: 1, Adapter: "b"})
			mustSubmit(t, e, 0, Request{ID: 3, Text: text("c", 64), MaxTokens: 1})
			first := e.Advance(0, nil)
			if st := e.Lora(); !slices.Equal(st.Running, []string{"a"}) || !slices.Equal(st.Waiting, []string{"b"}) {
				t.Fatalf("lora state %+v, want a running and b waiting", st)
			}
			evs := append(first, drain(t, e, 10000)...)
			a, _ := find(evs, Finished, 1)
			b, _ := find(evs, FirstToken, 2)
			c, _ := find(evs, FirstToken, 3)
			if b.At < a.At {
				t.Errorf("adapter b started at %v, before a's slot freed at %v", b.At, a.At)
			}
			if c.At >= a.At {
				t.Errorf("base request waited behind the blocked adapter: first token %v, a done %v", c.At, a.At)
			}
			if a.TTFT < 100*time.Millisecond {
				t.Errorf("a's first token %v does not include the adapter's load time", a.TTFT)
			}
			if st := e.Lora(); st.Loads != 2 || !slices.Equal(st.Loaded, []string{"b"}) {
				t.Errorf("lora state %+v, want 2 loads and b loaded", st)
			}
		})
	}
}

// An adapter's prompt never hits the base model's cache, nor another adapter's.
func TestLoraOwnCache(t *testing.T) {
	e := mustNew(t, Config{})
	p := text("shared", 256)
	mustSubmit(t, e, 0, Request{ID: 1, Text: p, MaxTokens: 1, Adapter: "x"})
	drain(t, e, 1000)
	if n := e.CachedPrefixFor("x", p); n < 200 {
		t.Errorf("adapter x's own prefix: %d cached tokens, want its prompt", n)
	}
	if n, m := e.CachedPrefix(p), e.CachedPrefixFor("y", p); n != 0 || m != 0 {
		t.Errorf("base model sees %d, adapter y %d cached tokens of adapter x's prompt, want 0", n, m)
	}
}

func TestLoraConfigBounds(t *testing.T) {
	for _, c := range []Config{{MaxLoras: -1}, {MaxLoras: 5000}, {LoraLoad: -time.Second}} {
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
}
