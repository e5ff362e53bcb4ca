package policy

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// backlogLoads reports a prefill backlog in tokens per worker id, every report from one poll and
// estimating `replicas` gateways; request loads are all zero.
type backlogLoads struct {
	tokens   map[string]int64
	replicas float64
}

var backlogPoll = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (backlogLoads) Load(*worker.Worker) int64 { return 0 }
func (l backlogLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	return loadmon.Report{WaitingUncachedTokens: l.tokens[w.ID], HasUncachedTokens: true, HasTokenData: true,
		PolledAt: backlogPoll, Replicas: l.replicas}, true
}

// TestCacheAwareHashPlacementByBacklog: at one gateway, while the fleet is prefill-bound, a new
// prompt does not go to its hash owner when the owner has far more prefill queued than the least;
// the tokens this replica sends since the poll count too. Below the gate, or with several
// replicas, the owner keeps it.
func TestCacheAwareHashPlacementByBacklog(t *testing.T) {
	ws := cahWorkers(t, 4)
	text := prompt(3, "first question")
	owner := newCAH(t, cahLoads{}).Pick(ws, &Request{Text: text}).ID
	backlog := func(ownerTokens int64) map[string]int64 {
		m := map[string]int64{}
		for _, w := range ws {
			m[w.ID] = 100
		}
		m[owner] = ownerTokens
		return m
	}

	if got := newCAH(t, backlogLoads{backlog(100 + prefillGateTokens/2), 1}).Pick(ws, &Request{Text: text}).ID; got != owner {
		t.Fatalf("decode-bound fleet (backlog gap below the gate): picked %s, want the owner %s", got, owner)
	}
	if got := newCAH(t, backlogLoads{backlog(20000), 1}).Pick(ws, &Request{Text: text}).ID; got == owner {
		t.Fatalf("prefill-bound, one gateway: the owner with 20,000 tokens queued against 100 took the prompt")
	}
	if got := newCAH(t, backlogLoads{backlog(20000), 8}).Pick(ws, &Request{Text: text}).ID; got != owner {
		t.Fatalf("prefill-bound, 8 gateways: picked %s, want the owner %s (replicas must agree)", got, owner)
	}

	// Since the poll this replica sends one worker enough tokens to lift it past the others:
	// the next new prompts avoid it, although its report still says 100.
	tokens := backlog(100)
	tokens[ws[0].ID] = 100 + 2*prefillGateTokens // one worker is far behind: prefill-bound
	p := newCAH(t, backlogLoads{tokens, 1})
	first := p.Pick(ws, &Request{Text: prompt(11, string(make([]byte, 4*spillTokens*4)))})
	if first.ID == ws[0].ID {
		t.Fatalf("the worker 2 gates behind took a new prompt")
	}
	if sent := p.sent.since(first.ID, backlogPoll); sent < 4*spillTokens {
		t.Fatalf("sent since the poll to %s: %v tokens, want the prompt's ≥ %d", first.ID, sent, 4*spillTokens)
	}
	for i := range 20 {
		if w := p.Pick(ws, &Request{Text: prompt(100+i, "x")}); w.ID == first.ID || w.ID == ws[0].ID {
			t.Fatalf("prompt %d went to %s, which the replica's own sends or its report put behind", i, w.ID)
		}
	}
	p.Forget(first.ID)
	if p.sent.since(first.ID, backlogPoll) != 0 {
		t.Fatal("Forget left the worker's since-poll count")
	}
}

// TestCacheAwareHashCountsWholePrompt: the since-poll count of a pick is the whole prompt's
// uncached tokens (PromptBytes), not only the routing text's, so one long prompt sent since the
// poll is enough to steer the next new prompts away from its worker.
func TestCacheAwareHashCountsWholePrompt(t *testing.T) {
	ws := cahWorkers(t, 4)
	tokens := map[string]int64{}
	for _, w := range ws {
		tokens[w.ID] = 100
	}
	tokens[ws[0].ID] = 100 + 2*prefillGateTokens // prefill-bound: the rule is on
	p := newCAH(t, backlogLoads{tokens, 1})

	// An 8 KiB routing text cut from a 48 KiB prompt: 12,288 tokens go to the engine, not 2,048.
	const textBytes, promptBytes = 8 << 10, 48 << 10
	text := prompt(21, string(make([]byte, textBytes)))[:textBytes]
	first := p.Pick(ws, &Request{Text: text, PromptBytes: promptBytes})
	want := float64(promptBytes) / charsPerToken
	if got := p.sent.since(first.ID, backlogPoll); got < want*0.99 {
		t.Fatalf("sent since the poll to %s: %.0f tokens, want the whole prompt's %.0f", first.ID, got, want)
	}
	for i := range 20 {
		if w := p.Pick(ws, &Request{Text: prompt(200+i, "x")}); w.ID == first.ID {
			t.Fatalf("prompt %d went to %s, which the long prompt sent since the poll put %.0f tokens behind", i, w.ID, want)
		}
	}

	// Without PromptBytes the routing text is all the policy knows.
	q := newCAH(t, backlogLoads{tokens, 1})
	w := q.Pick(ws, &Request{Text: text})
	if got := q.sent.since(w.ID, backlogPoll); got > float64(textBytes)/charsPerToken*1.01 {
		t.Fatalf("no PromptBytes: counted %.0f tokens, more than the routing text's %d", got, textBytes/charsPerToken)
	}
}

func TestUncachedTokens(t *testing.T) {
	for _, c := range []struct {
		req  Request
		want float64
	}{
		{Request{Text: "abcdefgh"}, 2},
		{Request{Text: "abcdefgh", PromptBytes: 400}, 100},
		{Request{Text: "abcdefgh", PromptBytes: 400, Decision: Decision{Predicted: 0.5}}, 99},
		{Request{Text: "abcdefgh", PromptBytes: 4, Decision: Decision{Predicted: 1}}, 0},
	} {
		if got := uncachedTokens(&c.req); got != c.want {
			t.Errorf("uncachedTokens(text %d bytes, prompt %d, predicted %v) = %v, want %v",
				len(c.req.Text), c.req.PromptBytes, c.req.Decision.Predicted, got, c.want)
		}
	}
}
