package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/loadmon"
)

func TestWarmConfigValidate(t *testing.T) {
	for _, c := range []WarmConfig{
		{Prefixes: -1}, {Prefixes: 5000}, {MaxTokens: -1}, {MaxTokens: 1 << 25},
		{Concurrency: -2}, {Concurrency: 65}, {Timeout: -time.Second}, {Timeout: 2 * time.Hour},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: want an error", c)
		}
	}
	if err := (WarmConfig{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if d := (WarmConfig{Prefixes: 8}).WithDefaults(); d.MaxTokens != 1<<18 || d.Concurrency != 4 || d.Timeout != time.Minute || !d.Enabled() {
		t.Fatalf("defaults %+v", d)
	}
}

// TestPlanWarmThenHit: the prefixes planned for a new worker are the tenants' contexts others
// hold, hottest first, within the token budget; planning records nothing (the new worker is no
// holder and gets no hit); once Warmed, the idle new worker takes the hits of what it holds.
func TestPlanWarmThenHit(t *testing.T) {
	loads := idReports{}
	p := newCostPolicy(t, "cache_aware_hash", nil, loads)
	costClock.t = time.Now()
	ws := cahWorkers(t, 4)
	old, added := ws[:3], ws[3]
	for i, sends := range []int{6, 4, 2, 1} { // tenant 3 is sent once: not reused
		for q := range sends {
			req := &Request{Text: prompt(i, fmt.Sprintf("question %d?", q))}
			Choose(context.Background(), p, old, req)
		}
	}
	now := time.Now()
	plan := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8}, now, 0)
	if len(plan) != 3 {
		t.Fatalf("planned %d prefixes, want the 3 reused tenants", len(plan))
	}
	for i, text := range plan {
		if !strings.HasPrefix(text, prompt(i, "")) {
			t.Fatalf("plan[%d] = %.40q..., want tenant %d's context", i, text, i)
		}
	}
	if got := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8, MaxTokens: WarmTokens(plan[0]) + 10}, now, 0); !slices.Equal(got, plan[:1]) {
		t.Fatalf("within a budget for one: got %d prefixes", len(got))
	}
	if got := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8, MaxTokens: 10}, now, 0); len(got) != 0 {
		t.Fatalf("within a budget for none: got %d prefixes", len(got))
	}
	if got := PlanWarm(p, added.ID, WarmConfig{Prefixes: 1}, now, 0); len(got) != 1 || got[0] != plan[0] {
		t.Fatal("Prefixes 1: want only the hottest")
	}
	if PlanWarm(p, added.ID, WarmConfig{}, now, 0) != nil || PlanWarm(NewRoundRobin(), added.ID, WarmConfig{Prefixes: 8}, now, 0) != nil {
		t.Fatal("warming off, or a policy without a tree: want no plan")
	}
	if got := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8}, now, len(plan[1])+utf8.UTFMax-1); len(got) != 0 {
		t.Fatalf("routing prefix as long as the prefixes: got %d, want none (they may be cut prompts)", len(got))
	}
	if got := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8}, now, len(plan[1])+utf8.UTFMax); len(got) != 3 {
		t.Fatalf("routing prefix longer than the prefixes: got %d, want 3", len(got))
	}
	if PlanWarm(p, added.ID, WarmConfig{Prefixes: 8}, now.Add(11*time.Minute), 0) != nil {
		t.Fatal("nothing touched in the last 10 minutes: want no plan")
	}

	// Planned but not warmed: the idle new worker is no holder, so the hit stays on tenant 0's.
	req := &Request{Text: prompt(0, "a new question?")}
	if w := Choose(context.Background(), p, ws, req); w == added || req.Decision.Branch != BranchCacheHit {
		t.Fatalf("before warming: %s by %s, want a hit on an old holder", req.Decision.Worker, req.Decision.Branch)
	}
	Warmed(p, added.ID, plan[0])
	// The old holder is busy (a long prefill queue); the new one idle.
	loads[req.Decision.Worker] = loadmon.Report{HasUncachedTokens: true, WaitingUncachedTokens: 50000, PolledAt: now}
	req = &Request{Text: prompt(0, "another question?")}
	if w := Choose(context.Background(), p, ws, req); w != added || req.Decision.Chosen.Cached < float64(len(prompt(0, "")))/4 {
		t.Fatalf("after warming: %s by %s, want a hit on the warmed worker", req.Decision.Worker, req.Decision.Branch)
	}
	if again := PlanWarm(p, added.ID, WarmConfig{Prefixes: 8}, now, 0); slices.Contains(again, plan[0]) {
		t.Fatal("a prefix the worker holds is planned again")
	}
}

// TestStickyWarms: sticky sessions pass warming through to the policy they wrap.
func TestStickyWarms(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Loads, cfg.NoBackground, cfg.Sticky.Enabled = cahLoads{}, true, true
	p, err := New("cache_aware", cfg)
	if err != nil {
		t.Fatal(err)
	}
	ws := cahWorkers(t, 2)
	for q := range 3 {
		Choose(context.Background(), p, ws[:1], &Request{Text: prompt(7, fmt.Sprintf("q%d", q))})
	}
	plan := PlanWarm(p, ws[1].ID, WarmConfig{Prefixes: 2}, time.Now(), 0)
	if len(plan) != 1 {
		t.Fatalf("sticky around cache_aware planned %d prefixes, want 1", len(plan))
	}
	Warmed(p, ws[1].ID, plan[0])
	if again := PlanWarm(p, ws[1].ID, WarmConfig{Prefixes: 2}, time.Now(), 0); len(again) != 0 {
		t.Fatal("Warmed through sticky did not reach the tree")
	}
}
