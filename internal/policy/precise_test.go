package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/worker"
)

// httpKV is fakeKV's table with a real tokenizer: kvevents.Tokenizer asking a loopback
// /tokenize, which counts the calls made while a Pick or a BestCost runs (picking is set then)
// apart from the others.
type httpKV struct {
	*fakeKV
	tok            *kvevents.Tokenizer
	picking        atomic.Bool
	inPick, others atomic.Int32
}

func (k *httpKV) Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	return k.tok.Tokenize(ctx, via, model, chat, body, text)
}

// newHTTPKV starts the tokenizer (one token a byte of the prompt; down answers 503) and returns
// workers whose /tokenize it is.
func newHTTPKV(t *testing.T, n int, down *atomic.Bool) (*httpKV, []*worker.Worker) {
	t.Helper()
	kv := &httpKV{fakeKV: &fakeKV{held: map[string]int{}}, tok: kvevents.NewTokenizer(kvevents.TokenizerConfig{Timeout: 5 * time.Second})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if kv.picking.Load() {
			kv.inPick.Add(1)
		} else {
			kv.others.Add(1)
		}
		var req struct{ Prompt string }
		if down != nil && down.Load() || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"count": len(req.Prompt), "tokens": make([]uint32, len(req.Prompt))})
	}))
	t.Cleanup(srv.Close)
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("%s/w%d", srv.URL, i)}, worker.BreakerConfig{Disabled: true})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		ws[i] = w
	}
	return kv, ws
}

// choosing is Choose with kv marking the pick's span.
func (k *httpKV) choosing(p Policy, ws []*worker.Worker, req *Request) *worker.Worker {
	k.picking.Store(true)
	defer k.picking.Store(false)
	return Choose(context.Background(), p, ws, req)
}

// TestPrecisePicksWithoutIO: precise_prefix's tokenizer is asked by Prepare, never while a pick
// or a price is taken, and the pick routes on the prepared tokens (the events' holder wins); a
// request nobody prepared is routed by the tree (fallback_tokenizer) without a call; with the
// tokenizer down, the prepared request falls back to the tree too.
func TestPrecisePicksWithoutIO(t *testing.T) {
	var down atomic.Bool
	kv, ws := newHTTPKV(t, 3, &down)
	kv.held[ws[2].ID] = 1 << 20
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	text := "a prompt long enough to hold a few blocks of tokens"

	req := &Request{Model: "m", Text: text}
	Prepare(context.Background(), p, ws, req)
	kv.picking.Store(true)
	if _, ok := p.BestCost(context.Background(), ws, req); !ok {
		t.Fatal("no price")
	}
	kv.picking.Store(false)
	if got := kv.choosing(p, ws, req); got != ws[2] || req.Decision.Branch != BranchPreciseHit {
		t.Fatalf("prepared pick: %s (%q), want the events' holder %s, precise_hit", got.ID, req.Decision.Branch, ws[2].ID)
	}
	if n, m := kv.inPick.Load(), kv.others.Load(); n != 0 || m != 1 {
		t.Fatalf("tokenizer calls: %d during the pick and price, %d in Prepare; want 0 and 1", n, m)
	}

	if got := kv.choosing(p, ws, &Request{Model: "m", Text: text + " and more"}); got == nil {
		t.Fatal("no pick unprepared")
	}
	down.Store(true)
	other := &Request{Model: "m", Text: "another prompt, with the tokenizer down"}
	Prepare(context.Background(), p, ws, other)
	if got := kv.choosing(p, ws, other); got == nil || other.Decision.Branch == BranchPreciseHit {
		t.Fatalf("tokenizer down: %v (%q), want a pick by the tree", got, other.Decision.Branch)
	}
	if n := kv.inPick.Load(); n != 0 {
		t.Fatalf("%d tokenizer calls during picks", n)
	}
	if d := p.Decisions(); d[BranchFallbackTokenizer] != 2 || d[BranchPreciseHit] != 1 {
		t.Fatalf("decisions %v, want 2 fallback_tokenizer (unprepared, tokenizer down), 1 precise_hit", d)
	}
}

// TestStickyPreparesOnlyWhatItAsks: the sticky wrapper forwards Prepare when its Pick will ask
// the wrapped policy (a keyless request; a new session with placement "policy"), and not for a
// bound session or with placement "hash", which route without the wrapped policy's decision.
func TestStickyPreparesOnlyWhatItAsks(t *testing.T) {
	for _, placement := range []string{PlaceHash, PlacePolicy} {
		t.Run(placement, func(t *testing.T) {
			kv, ws := newHTTPKV(t, 3, nil)
			clk := &clock{t: time.Unix(1000, 0)}
			cfg := DefaultConfig()
			cfg.KV, cfg.Loads, cfg.NoBackground, cfg.Now = kv, cahLoads{}, true, clk.now
			cfg.Sticky.Enabled, cfg.Sticky.Placement, cfg.Sticky.TTL = true, placement, time.Minute
			p, err := New("precise_prefix", cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.(*Sticky).Close() })
			calls := func(req *Request) int32 {
				before := kv.others.Load()
				Prepare(context.Background(), p, ws, req)
				kv.choosing(p, ws, req)
				return kv.others.Load() - before
			}
			wantNew := int32(0)
			if placement == PlacePolicy {
				wantNew = 1
			}
			if n := calls(&Request{Model: "m", Text: "keyless prompt"}); n != 1 {
				t.Errorf("keyless: %d tokenizations, want 1", n)
			}
			if n := calls(&Request{Model: "m", Key: "s1", Text: "first turn"}); n != wantNew {
				t.Errorf("new session: %d tokenizations, want %d", n, wantNew)
			}
			if n := calls(&Request{Model: "m", Key: "s1", Text: "first turn, second turn"}); n != 0 {
				t.Errorf("bound session: %d tokenizations, want 0", n)
			}
			clk.advance(2 * time.Minute)
			if n := calls(&Request{Model: "m", Key: "s1", Text: "after a silence"}); n != wantNew {
				t.Errorf("expired session: %d tokenizations, want %d", n, wantNew)
			}
			if n := kv.inPick.Load(); n != 0 {
				t.Errorf("%d tokenizer calls during picks", n)
			}
		})
	}
}
