package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// fakeKV answers Match from a fixed table worker id → tokens held, and tokenizes one token per
// byte; fail makes tokenization fail, blind makes Match unable to answer.
type fakeKV struct {
	held        map[string]int
	fail, blind bool
	tokenized   int
}

func (f *fakeKV) Tokenize(_ context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	f.tokenized++
	if f.fail {
		return nil, errors.New("tokenizer down")
	}
	return make([]uint32, len(text)), nil
}

func (f *fakeKV) Covers(string, []string) bool { return !f.blind }

func (f *fakeKV) Match(model string, toks []uint32, ids []string, out []int) bool {
	if f.blind {
		return false
	}
	for i, id := range ids {
		out[i] = min(f.held[id], len(toks))
	}
	return true
}

func newPrecise(t *testing.T, kv KVView, loads Loads) *PrecisePrefix {
	t.Helper()
	cfg := DefaultConfig()
	cfg.KV, cfg.Loads, cfg.NoBackground = kv, loads, true
	p, err := New("precise", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*PrecisePrefix)
}

// The tree remembers sending a prompt to a worker; the events say that worker evicted it and
// another holds it: the events win.
func TestPreciseFollowsEventsOverTheTree(t *testing.T) {
	ws := cahWorkers(t, 3)
	kv := &fakeKV{held: map[string]int{}}
	p := newPrecise(t, kv, cahLoads{})
	text := strings.Repeat("shared system prompt ", 50)
	req := &Request{Model: "m", Text: text}
	kv.held[ws[1].ID] = len(text)
	if got := p.Pick(ws, req); got != ws[1] {
		t.Fatalf("first pick %s, want the holder %s", got.ID, ws[1].ID)
	}
	// engine 1 evicts it; engine 2 now holds it (another replica sent it there).
	kv.held = map[string]int{ws[2].ID: len(text)}
	if got := p.Pick(ws, req); got != ws[2] {
		t.Fatalf("after the eviction: %s, want %s", got.ID, ws[2].ID)
	}
	// Nobody holds enough: placed by the hash of the prompt's tokens, so that another replica
	// seeing the same events places it on the same worker.
	kv.held = map[string]int{ws[0].ID: len(text) / 10}
	miss := p.Pick(ws, &Request{Model: "m", Text: "x" + text})
	other := newPrecise(t, &fakeKV{held: kv.held}, cahLoads{})
	if got := other.Pick(cahWorkers(t, 3), &Request{Model: "m", Text: "x" + text}); got.ID != miss.ID {
		t.Fatalf("replicas placed a miss on %s and %s", miss.ID, got.ID)
	}
	d := p.Decisions()
	if d[BranchPreciseHit] != 2 || d[BranchPreciseMiss] != 1 || d[BranchFallbackNoEvents] != 0 {
		t.Fatalf("decisions %v", d)
	}
	if n, _ := p.DecisionTime(); n != 3 {
		t.Fatalf("decision time counted %d decisions", n)
	}
}

// Among several holders the least loaded wins; an imbalanced pool goes to the least loaded.
func TestPreciseLoadRules(t *testing.T) {
	ws := cahWorkers(t, 3)
	text := strings.Repeat("abc ", 100)
	kv := &fakeKV{held: map[string]int{ws[0].ID: len(text), ws[1].ID: len(text)}}
	loads := cahLoads{ws[0].ID: 9, ws[1].ID: 3, ws[2].ID: 0}
	p := newPrecise(t, kv, loads)
	if got := p.Pick(ws, &Request{Text: text}); got != ws[1] {
		t.Fatalf("got %s, want the less loaded holder %s", got.ID, ws[1].ID)
	}
	loads[ws[0].ID], loads[ws[1].ID] = 500, 500
	if got := p.Pick(ws, &Request{Text: text}); got != ws[2] {
		t.Fatalf("imbalanced pool: got %s, want the least loaded %s", got.ID, ws[2].ID)
	}
}

// Without events or a tokenizer the tree decides, and the metric says so.
func TestPreciseFallsBack(t *testing.T) {
	ws := cahWorkers(t, 2)
	text := strings.Repeat("abc ", 100)
	for name, kv := range map[string]*fakeKV{"blind": {blind: true}, "tokenizer": {fail: true}} {
		t.Run(name, func(t *testing.T) {
			p := newPrecise(t, kv, cahLoads{})
			ref := newPrecise(t, nil, cahLoads{}).CacheAwareHash
			for i := range 5 {
				req := &Request{Text: fmt.Sprintf("%d %s", i, text)}
				if got, want := p.Pick(ws, req), ref.Pick(ws, req); got.ID != want.ID {
					t.Fatalf("fallback picked %s, cache_aware_hash %s", got.ID, want.ID)
				}
			}
			d := p.Decisions()
			branch := map[string]string{"blind": BranchFallbackNoEvents, "tokenizer": BranchFallbackTokenizer}[name]
			if d[branch] != 5 || d[BranchPreciseHit]+d[BranchPreciseMiss] != 0 {
				t.Fatalf("decisions %v", d)
			}
			if name == "blind" && kv.tokenized != 0 {
				t.Fatalf("tokenized %d prompts that no event could match", kv.tokenized)
			}
		})
	}
}

// Prompts that share only an opening two engines hold get placement keys from what follows it;
// with the opening held by one engine only, the key covers the first 64 tokens alone.
func TestTokenPlacementKeyCutsPastTheSharedOpening(t *testing.T) {
	a, b := make([]uint32, 400), make([]uint32, 400)
	for i := range a {
		a[i], b[i] = uint32(i), uint32(i)
	}
	for i := 300; i < 400; i++ {
		b[i] = 7
	}
	if tokenPlacementKey(a, []int{288, 288, 0}) == tokenPlacementKey(b, []int{288, 288, 0}) {
		t.Fatal("prompts differing past a shared 288-token opening got the same key")
	}
	if tokenPlacementKey(a, []int{288, 0, 0}) != tokenPlacementKey(b, []int{288, 0, 0}) {
		t.Fatal("with one holder the key should cover the first 64 tokens only")
	}
}
