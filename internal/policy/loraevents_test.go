package policy

import (
	"context"
	"testing"
)

// adapterKV is a KV view that keys blocks by adapter: byAdapter[adapter][worker] tokens held
// ("" the base model's, which Match answers from held).
type adapterKV struct {
	fakeKV
	byAdapter map[string]map[string]int
	models    []string // the models Covers and MatchAdapter were asked for
}

func (k *adapterKV) Covers(model string, ids []string) bool {
	k.models = append(k.models, model)
	return true
}

func (k *adapterKV) MatchAdapter(model, adapter string, salt uint64, salted bool, toks []uint32, ids []string, out []int) bool {
	k.models = append(k.models, model)
	for i, id := range ids {
		out[i] = min(k.byAdapter[adapter][id], len(toks))
	}
	return true
}

// TestPreciseMatchesAdaptersOwnBlocks: precise_prefix credits an adapter's request with its own
// adapter's blocks only, looked up in the streams of its base model: a worker holding the base
// model's blocks of the prompt, or another adapter's, gets nothing.
func TestPreciseMatchesAdaptersOwnBlocks(t *testing.T) {
	ws := cahWorkers(t, 3)
	text := "an adapter's long prompt that the events report as held somewhere"
	kv := &adapterKV{fakeKV: fakeKV{held: map[string]int{ws[0].ID: 1 << 20}},
		byAdapter: map[string]map[string]int{"sql": {ws[2].ID: 1 << 20}, "chat": {ws[1].ID: 1 << 20}}}
	p := newCostPolicy(t, "precise_prefix", kv, idReports{})
	req := &Request{Model: "sql", Parent: "base", Adapter: "sql", Text: text, PromptBytes: 400}
	if got := prepChoose(context.Background(), p, ws, req); got != ws[2] {
		t.Fatalf("adapter request went to %s, want the holder of its adapter's blocks %s", got.ID, ws[2].ID)
	}
	if req.Decision.Branch != BranchPreciseHit || req.Decision.Chosen.Cached == 0 {
		t.Fatalf("decision %q %+v, want a precise hit", req.Decision.Branch, req.Decision.Chosen)
	}
	for _, m := range kv.models {
		if m != "base" {
			t.Fatalf("streams looked up for model %q, want the base model's", m)
		}
	}
	other := &Request{Model: "other", Parent: "base", Adapter: "other", Text: text + " again", PromptBytes: 400}
	prepChoose(context.Background(), p, ws, other)
	if other.Decision.Branch != BranchPreciseMiss || other.Decision.Chosen.Cached != 0 {
		t.Fatalf("an adapter nobody holds: %q %+v, want a precise miss", other.Decision.Branch, other.Decision.Chosen)
	}
}
