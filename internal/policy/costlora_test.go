package policy

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// The adapter term: an adapter goes where it runs, else where a slot is free, never where every
// slot is held by others while another choice exists; the blind baseline does not see it; a
// base-model request pays nothing.
func TestCostAdapterTerm(t *testing.T) {
	ws := cahWorkers(t, 3)
	now := time.Unix(1000, 0)
	rep := func(running ...string) loadmon.Report {
		return loadmon.Report{HasTokenData: true, HasUncachedTokens: true, PolledAt: now,
			LoRA: &loadmon.LoRA{Running: running, MaxLoras: 2, Has: true}}
	}
	reports := idReports{ws[0].ID: rep("x", "y"), ws[1].ID: rep("a"), ws[2].ID: rep("z")}
	for _, blind := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Loads, cfg.NoBackground, cfg.Now = reports, true, func() time.Time { return now }
		cfg.Cost.LoRA.Blind = blind
		p, err := New("least_load", cfg)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i := range 20 {
			req := &Request{PromptBytes: 400, Text: string(rune('A' + i)), Adapter: "a"}
			w := prepChoose(context.Background(), p, ws, req)
			seen[w.ID] = true
			// The first three: after them, what this replica sent since the (never renewed)
			// report outweighs the adapter's load elsewhere, as it should.
			if !blind && i < 3 && (w != ws[1] || req.Decision.Chosen.Adapter != 0) {
				t.Fatalf("adapter a went to %s, want %s: %v / %v", w.ID, ws[1].ID, req.Decision.Chosen, req.Decision.RunnerUp)
			}
		}
		if blind && len(seen) < 2 {
			t.Errorf("the blind baseline followed the adapter: %v", seen)
		}
		if blind {
			continue
		}
		p, _ = New("least_load", cfg) // a replica that has sent nothing yet
		req := &Request{PromptBytes: 400, Adapter: "new"}
		if w := prepChoose(context.Background(), p, ws, req); w == ws[0] {
			t.Errorf("a new adapter went to the worker whose slots are all held (L %v)", req.Decision.Chosen.Adapter)
		}
		// This replica just sent "new" somewhere: the next request for it follows.
		first := req.Decision.Worker
		req2 := &Request{PromptBytes: 400, Text: "other", Adapter: "new"}
		if w := prepChoose(context.Background(), p, ws, req2); w.ID != first {
			t.Errorf("the second request for a just-sent adapter went to %s, not %s", w.ID, first)
		}
		base := &Request{PromptBytes: 400}
		prepChoose(context.Background(), p, ws, base)
		if base.Decision.Chosen.Adapter != 0 {
			t.Errorf("a base-model request paid L = %v", base.Decision.Chosen.Adapter)
		}
	}
}

func TestLoRACostValidate(t *testing.T) {
	for _, c := range []LoRACost{{Load: -1}, {SlotWait: 1e9}} {
		cc := DefaultCostConfig()
		cc.LoRA = c
		if cc.validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
}

// precise_prefix does not credit an adapter's request with the blocks the events report when
// the KV view cannot key them by adapter (no AdapterMatcher; loraevents_test.go has one that
// can): those are the base model's as far as it can tell; the adapter's own tree places it.
func TestPreciseSkipsEventsForAdapters(t *testing.T) {
	ws := cahWorkers(t, 2)
	kv := &fakeKV{held: map[string]int{ws[0].ID: 1 << 20}}
	p := newCostPolicy(t, "precise_prefix", kv, idReports{})
	base := &Request{Text: "a prompt the engine holds", PromptBytes: 400}
	prepChoose(context.Background(), p, ws, base)
	if base.Decision.Branch != BranchPreciseHit {
		t.Fatalf("base request branch %q, want %q", base.Decision.Branch, BranchPreciseHit)
	}
	ad := &Request{Text: "another prompt the events say the engine holds", PromptBytes: 400, Adapter: "x"}
	prepChoose(context.Background(), p, ws, ad)
	if ad.Decision.Branch == BranchPreciseHit || ad.Decision.Chosen.Cached > 0 {
		t.Errorf("adapter request credited with the events' blocks: %q, %v", ad.Decision.Branch, ad.Decision.Chosen)
	}
}
