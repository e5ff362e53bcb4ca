package policy

import (
	"context"
	"strings"
	"testing"
)

// partialKV answers from held for the workers in published only (PartialKVView).
type partialKV struct {
	fakeKV
	published map[string]bool
}

func (f *partialKV) Covers(_ string, ids []string) bool {
	for _, id := range ids {
		if !f.published[id] {
			return false
		}
	}
	return true
}

func (f *partialKV) Match(model string, toks []uint32, ids []string, out []int) bool {
	return f.MatchEach(model, toks, ids, out) == len(ids)
}

func (f *partialKV) CoversAny(_ string, ids []string) bool {
	for _, id := range ids {
		if f.published[id] {
			return true
		}
	}
	return false
}

func (f *partialKV) MatchEach(_ string, toks []uint32, ids []string, out []int) int {
	n := 0
	for i, id := range ids {
		if !f.published[id] {
			out[i] = -1
			continue
		}
		out[i] = min(f.held[id], len(toks))
		n++
	}
	return n
}

// TestPreciseFallsBackPerWorker: one engine has not published yet; it is scored from the tree
// (which holds the prompt there) while the other uses its events, and the decision is a
// precise one, not the whole fleet's fallback.
func TestPreciseFallsBackPerWorker(t *testing.T) {
	ws := cahWorkers(t, 2)
	kv := &partialKV{fakeKV: fakeKV{held: map[string]int{}}, published: map[string]bool{ws[1].ID: true}}
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	text := strings.Repeat("a conversation only the quiet engine was sent ", 30)
	p.RecordWarm(ws[0].ID, text) // the tree holds it on the engine without events
	req := &Request{Model: "m", Text: text}
	if got := prepChoose(context.Background(), p, ws, req); got != ws[0] {
		t.Fatalf("picked %s, want %s, which the tree says holds the prompt", got.ID, ws[0].ID)
	}
	d := p.Decisions()
	if d[BranchFallbackNoEvents] != 0 || d[BranchPreciseHit]+d[BranchPreciseMiss] != 1 {
		t.Fatalf("decisions %v: want one precise decision, no fleet-wide fallback", d)
	}
	// Once the events show the other engine holding it, and the quiet one still unpublished with
	// nothing in the tree, the events win.
	other := strings.Repeat("a prompt the published engine holds ", 30)
	kv.held[ws[1].ID] = len(other)
	if got := prepChoose(context.Background(), p, ws, &Request{Model: "m", Text: other}); got != ws[1] {
		t.Fatalf("picked %s, want the published holder %s", got.ID, ws[1].ID)
	}
}
