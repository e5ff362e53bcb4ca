package policy

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestSaltSeparatesPrefixes: the same prompt sent again with another cache salt is predicted no
// hit (the decision's recorded Ĉ is 0 on every candidate), and with its own salt a hit where it
// went; the tree's text is salted, the tokenizer's is not.
func TestSaltSeparatesPrefixes(t *testing.T) {
	ws := cahWorkers(t, 4)
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	text := prompt(3, " a question")
	salted := func(salt uint64) *Request {
		return &Request{Text: SaltedText(text, salt), Salt: salt, Salted: true, PromptBytes: len(text)}
	}
	first := prepChoose(context.Background(), p, ws, salted(1))
	again := salted(1)
	if got := prepChoose(context.Background(), p, ws, again); got != first || again.Decision.Chosen.Cached == 0 {
		t.Fatalf("the same salt: %s with Ĉ %v, want %s with a hit", got.ID, again.Decision.Chosen.Cached, first.ID)
	}
	other := salted(2)
	prepChoose(context.Background(), p, ws, other)
	if d := other.Decision; !d.HasCost || d.Chosen.Cached != 0 || d.RunnerUp.Cached != 0 || d.Predicted != 0 {
		t.Fatalf("another salt: decision %+v, want no predicted hit", d)
	}
	unsalted := &Request{Text: text, PromptBytes: len(text)}
	prepChoose(context.Background(), p, ws, unsalted)
	if d := unsalted.Decision; d.Chosen.Cached != 0 || d.Predicted != 0 {
		t.Fatalf("no salt: decision %+v, want no predicted hit", d)
	}
}

// saltedKV is a fakeKV that keys what it holds by salt, as the KV-event index does.
type saltedKV struct {
	fakeKV
	bySalt map[uint64]map[string]int
	text   string // the last text tokenized
}

func (k *saltedKV) Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	k.text = text
	return k.fakeKV.Tokenize(ctx, via, model, chat, body, text)
}

func (k *saltedKV) MatchSalted(model string, salt uint64, toks []uint32, ids []string, out []int) bool {
	for i, id := range ids {
		out[i] = min(k.bySalt[salt][id], len(toks))
	}
	return true
}

// TestPreciseLooksSaltedPromptsUpBySalt: precise routing tokenizes a salted prompt without the
// salt's mark and matches it under its salt only; a KV view that cannot key by salt leaves the
// salted prompt to the tree.
func TestPreciseLooksSaltedPromptsUpBySalt(t *testing.T) {
	ws := cahWorkers(t, 3)
	text := strings.Repeat("shared system prompt ", 50)
	kv := &saltedKV{fakeKV: fakeKV{held: map[string]int{ws[0].ID: len(text)}}, bySalt: map[uint64]map[string]int{7: {ws[2].ID: len(text)}}}
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	req := &Request{Model: "m", Text: SaltedText(text, 7), Salt: 7, Salted: true}
	if got := prepChoose(context.Background(), p, ws, req); got != ws[2] {
		t.Fatalf("salted pick %s, want the holder under its salt %s", got.ID, ws[2].ID)
	}
	if kv.text != text {
		t.Fatalf("the tokenizer saw %q, want the prompt without the salt's mark", kv.text)
	}
	req = &Request{Model: "m", Text: SaltedText(text, 8), Salt: 8, Salted: true}
	prepChoose(context.Background(), p, ws, req)
	if req.Decision.Chosen.Cached != 0 || req.Decision.Branch != BranchPreciseMiss {
		t.Fatalf("another salt: %+v, want a precise miss", req.Decision)
	}
	plain := newCostPolicy(t, "precise", &fakeKV{held: map[string]int{ws[0].ID: len(text)}}, cahLoads{})
	req = &Request{Model: "m", Text: SaltedText(text, 7), Salt: 7, Salted: true}
	prepChoose(context.Background(), plain, ws, req)
	if d := plain.Decisions(); d[BranchFallbackNoEvents] != 1 || req.Decision.Chosen.Cached != 0 {
		t.Fatalf("a view without salts: decisions %v, decision %+v; want the tree's fallback and no hit", d, req.Decision)
	}
}

// TestAffinityPlacesAConversation: prompts of one conversation (one Affinity key) that no tree
// holds go to one worker, the key's rendezvous owner, on every replica; without the key the
// same prompts spread.
func TestAffinityPlacesAConversation(t *testing.T) {
	ws := cahWorkers(t, 6)
	a, b := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{}), newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	withKey, without := map[string]bool{}, map[string]bool{}
	for i := range 12 {
		text := prompt(100+i, " an opening no tree holds")
		ga := prepChoose(context.Background(), a, ws, &Request{Text: text, Affinity: "k\x00conv-1", PromptBytes: len(text)})
		a.Forget(ga.ID) // each prompt finds no tree, as on a replica that never saw the conversation
		gb := prepChoose(context.Background(), b, ws, &Request{Text: text, Affinity: "k\x00conv-1", PromptBytes: len(text)})
		b.Forget(gb.ID)
		if ga != gb {
			t.Fatalf("prompt %d: the replicas placed the conversation on %s and %s", i, ga.ID, gb.ID)
		}
		withKey[ga.ID] = true
		w := prepChoose(context.Background(), a, ws, &Request{Text: text, PromptBytes: len(text)})
		a.Forget(w.ID)
		without[w.ID] = true
	}
	if len(withKey) != 1 || len(without) < 2 {
		t.Fatalf("with the key: %d workers, without: %d; want 1 and several", len(withKey), len(without))
	}
}
