package gateway

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestAnEvictionShownByAnAnswerCorrectsTheTree: a `kvgate sim` engine with a small cache was
// sent two prompts under one opening; other traffic (straight to the engine, past the gateway)
// evicts them; the next answer for one of them shows it held nothing, so the gateway no longer
// predicts the other one there: its prediction for it falls from all of it to about what the
// engine then reports (the opening, which the answer put back).
//
// The engine and the gateway run in a synctest bubble on testutil.MemNet: the engine's prefill of
// the 14,000 tokens passes on the bubble's clock.
func TestAnEvictionShownByAnAnswerCorrectsTheTree(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		eng := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{KVTokens: 4096}})
		t.Cleanup(eng.Close)
		es := mn.NewServer(eng)
		t.Cleanup(es.Close)
		g, _ := newAuditGatewayOn(t, mn, Config{AuditHeaders: true}, "cache_aware_hash", policy.DefaultConfig(), 0)
		g.mustRegister(t, AddWorkerRequest{URL: es.URL})
		bearer := g.bearer

		complete := func(url, prompt string, hdr ...string) (predicted float64, cached, tokens int) {
			t.Helper()
			body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
			h, b := testutil.PostOKVia(t, g.client, url+"/v1/completions", bearer, body)
			if h == nil {
				t.FailNow()
			}
			p, c, _ := answerTokens(b)
			predicted, _ = strconv.ParseFloat(h.Get("X-Kvgate-Predicted-Hit"), 64)
			return predicted, c, p
		}
		open := strings.Repeat("shared opening ", 100)                                     // 1,500 bytes
		x, y := open+strings.Repeat("first x ", 150), open+strings.Repeat("other y ", 150) // 2,700 bytes each
		for _, p := range []string{x, y} {
			complete(g.srv.URL, p)
			g.waitDone(t, 1)
		}
		if pred, _, _ := complete(g.srv.URL, x); pred < 0.9 {
			t.Fatalf("before the eviction the gateway predicts %.1f of x cached, want all", pred)
		}
		g.waitDone(t, 1)
		for i := range 12 { // 12 × 1,000 tokens through a 4,096-token cache, past the gateway
			complete(es.URL, fmt.Sprintf("unrelated traffic %d ", i)+strings.Repeat("z", 4000))
		}
		if pred, cached, _ := complete(g.srv.URL, y+" and more"); pred < 0.9 || cached != 0 {
			t.Fatalf("y after the eviction: predicted %.1f, cached %d; want the stale prediction and nothing cached", pred, cached)
		}
		g.waitDone(t, 1)
		pred, cached, tokens := complete(g.srv.URL, x)
		g.waitDone(t, 1)
		if got := float64(cached) / float64(tokens); pred > got+0.15 {
			t.Fatalf("x after the answer that showed the eviction: predicted %.1f, the engine held %.2f", pred, got)
		}
	})
}
