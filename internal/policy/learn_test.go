package policy

import (
	"context"
	"math"
	"strings"
	"testing"
)

// TestLearnsTheFollowShareFromAnswers: the prompt runs far past the routing text, whose whole the
// tree holds; the engines keep reporting only the routing text cached. The prediction starts at
// the prior (everything past it cached) and learns what the answers say; the cost keeps
// pricing the prior.
func TestLearnsTheFollowShareFromAnswers(t *testing.T) {
	ws := cahWorkers(t, 4)
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	text := prompt(1, " the conversation so far")
	const promptBytes = 40 << 10
	Choose(context.Background(), p, ws, &Request{Text: text, PromptBytes: promptBytes})
	first := 0.0
	for i := range 300 {
		req := &Request{Text: text, PromptBytes: promptBytes}
		w := Choose(context.Background(), p, ws, req)
		if i == 0 {
			first = req.Decision.Predicted
		}
		// The engine held the routing text (in its tokens) and nothing past it.
		p.Learn(req, Answer{Worker: w.ID, PromptTokens: promptBytes / 4, CachedTokens: len(text) / 4})
	}
	req := &Request{Text: text, PromptBytes: promptBytes}
	Choose(context.Background(), p, ws, req)
	want := float64(len(text)) / promptBytes
	if first < 0.9 {
		t.Fatalf("first prediction %.3f, want the prior's ≥ 0.9", first)
	}
	if got := req.Decision.Predicted; math.Abs(got-want) > 0.05 {
		t.Errorf("prediction after 300 answers %.3f, want %.3f ± 0.05", got, want)
	}
	if c := req.Decision.Chosen; c.Cached < c.Prompt {
		t.Errorf("Ĉ %.0f of %.0f: the cost prices the prior F (1) unless FollowRouteLearned", c.Cached, c.Prompt)
	}
	own, shared := p.FollowShares()
	if own > 0.05 || shared != 1 {
		t.Errorf("follow shares own %.3f shared %.3f, want own ≈ 0 and shared untouched (1)", own, shared)
	}
	cal := p.Calibration()
	if len(cal) != 1 || cal[req.Decision.Worker] <= 0 {
		t.Errorf("calibration %v, want one worker over-predicted", cal)
	}
	p.Forget(req.Decision.Worker)
	if len(p.Calibration()) != 0 {
		t.Error("Forget kept the worker's calibration")
	}
}

// TestLearnCorrectsTheTree: a worker was sent two conversations under one opening; an answer for
// the second shows the engine held none of the opening the tree placed there, so it evicted what
// hung below it: the tree no longer places the first conversation there.
func TestLearnCorrectsTheTree(t *testing.T) {
	ws := cahWorkers(t, 1)
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	open := strings.Repeat("the shared system prompt ", 40)
	one, two := open+strings.Repeat("conversation one ", 40), open+strings.Repeat("conversation two ", 40)
	Choose(context.Background(), p, ws, &Request{Text: one})
	costClock.t = costClock.t.Add(1)
	req := &Request{Text: two}
	Choose(context.Background(), p, ws, req)
	if chars, _ := p.tree.Lookup(one); chars != len(one) {
		t.Fatalf("before the answer the tree holds %d of %d chars", chars, len(one))
	}
	p.Learn(req, Answer{Worker: ws[0].ID, PromptTokens: len(two) / 4, CachedTokens: 0})
	if chars, _ := p.tree.Lookup(one); chars > len(open+"conversation ") {
		t.Errorf("after the answer the tree holds %d chars of conversation one, want the opening's %d", chars, len(open))
	}
	if chars, _ := p.tree.Lookup(two); chars != len(two) {
		t.Errorf("the answered prompt's own path: %d of %d chars, want all (its prefill put it back)", chars, len(two))
	}
	// An answer for another worker, or one without a prediction, teaches nothing.
	before := p.TreeSizes()
	p.Learn(&Request{Text: two}, Answer{Worker: ws[0].ID, PromptTokens: 10, CachedTokens: 0})
	p.Learn(req, Answer{Worker: "other", PromptTokens: 10, CachedTokens: 0})
	if after := p.TreeSizes(); after[ws[0].ID] != before[ws[0].ID] {
		t.Errorf("sizes %v → %v", before, after)
	}
}

// TestFollowMedianOfBimodalTails: tails cached whole or not at all are predicted by the
// weighted median (the least absolute error), not the mean, which no answer is near.
func TestFollowMedianOfBimodalTails(t *testing.T) {
	var f follower
	for i := range 100 {
		cached := 0.0
		if i%5 < 3 {
			cached = 1000 // 60 % of the tails wholly cached
		}
		f.add(followOwn, cached, 1000, 2000)
	}
	if m, ok := f.median(followOwn); !ok || m != 1 {
		t.Errorf("median %v %v, want 1", m, ok)
	}
	if mean := f.share(followOwn, 1); math.Abs(mean-0.6) > 0.05 {
		t.Errorf("mean share %.3f, want about 0.6", mean)
	}
	if _, ok := f.median(followShared); ok {
		t.Error("a class without answers has a median")
	}
}
