package gateway

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
)

// evictionDrill is the scenario of an evicted prompt, on two engines of the same small cache
// (about 4,096 tokens) at the URLs x and y, behind g (the default policy, audit headers on):
//
//  1. x alone serves prompt a, then rounds of 6 new prompts of about a quarter of its cache
//     each, every round sending its first prompt again (x evicted it: its answer shows nothing
//     cached) and its last (x keeps it): the answers teach the tree how much x keeps;
//  2. y joins, and holds a (sent to it straight, past the gateway);
//  3. a comes again, under a routing key whose rendezvous owner is y.
//
// x let a go long ago: with x's capacity learned the tree no longer places a there, so the
// cost finds a cached nowhere it can see and sends it by the key to y, which has it (the answer
// reports it cached). Without the learned capacity the tree still places a on x, which gets it
// back for a full prefill. words is how many words make a quarter of the cache in the engines'
// tokens.
func evictionDrill(t *testing.T, g *testGateway, x, y string, words int) {
	t.Helper()
	type answer struct {
		worker         string
		cached, tokens int
	}
	complete := func(url, prompt string, hdr ...string) answer {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
		h, b := testutil.MustPostOK(t, url+"/v1/completions", g.bearer, body, hdr...)
		p, c, ok := answerTokens(b)
		if !ok {
			t.Fatalf("the engine reported no cached tokens: %s", b)
		}
		if url == g.srv.URL {
			g.waitDone(t, 1)
		}
		return answer{h.Get(headerWorker), c, p}
	}
	text := func(name string) string {
		return name + ": " + strings.Repeat(strings.ReplaceAll(name, " ", "-")+" ", words)
	}
	wx, err := g.Register(t.Context(), AddWorkerRequest{URL: x})
	if err != nil {
		t.Fatal(err)
	}
	a := text("the prompt x evicts")
	ax := complete(g.srv.URL, a).worker // x's audit id

	for r := range 4 {
		var round []string
		for i := range 6 {
			round = append(round, text(fmt.Sprintf("round %d prompt %d", r, i)))
			complete(g.srv.URL, round[i])
		}
		if got := complete(g.srv.URL, round[0]); got.cached*4 > got.tokens {
			t.Fatalf("round %d: x kept its first prompt (%d of %d tokens cached): the cache is not small enough for the drill", r, got.cached, got.tokens)
		}
		if got := complete(g.srv.URL, round[5]); got.cached*2 < got.tokens {
			t.Fatalf("round %d: x lost its last prompt (%d of %d tokens cached)", r, got.cached, got.tokens)
		}
	}
	if _, err := g.Register(t.Context(), AddWorkerRequest{URL: y}); err != nil {
		t.Fatal(err)
	}
	if got := complete(y, a); got.tokens == 0 {
		t.Fatal("y did not serve a")
	}
	key := ""
	for i := range 32 { // a fresh prompt is cached nowhere: the key's owner gets it
		k := fmt.Sprintf("conversation %d", i)
		if complete(g.srv.URL, fmt.Sprintf("which worker owns key %d?", i), "X-Kvgate-Routing-Key", k).worker != ax {
			key = k
			break
		}
	}
	if key == "" {
		t.Fatal("no routing key of 32 is owned by y")
	}
	capacity := workerGauge(t, g.Server, "kvgate_prefix_tree_capacity_tokens")[wx.ID]
	got := complete(g.srv.URL, a, "X-Kvgate-Routing-Key", key)
	t.Logf("a went to %s (x is %s): %d of %d tokens cached; x's learned capacity %.0f tokens", got.worker, ax,
		got.cached, got.tokens, capacity)
	if capacity < 4096/2 || capacity > 4096*2 {
		t.Errorf("kvgate_prefix_tree_capacity_tokens for x: %.0f tokens, want its engine's 4,096 within a factor of 2", capacity)
	}
	if got.worker == ax || got.cached*2 < got.tokens {
		t.Fatalf("the evicted prompt went to %s with %d of %d tokens cached; want y, which holds it, not x (%s), which let it go",
			got.worker, got.cached, got.tokens, ax)
	}
}

// TestAnEvictedPromptGoesWhereTheCostSays: evictionDrill on two `kvgate sim` engines of 4,096
// tokens of KV cache.
func TestAnEvictedPromptGoesWhereTheCostSays(t *testing.T) {
	var urls []string
	for range 2 {
		eng := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{KVTokens: 4096}})
		t.Cleanup(eng.Close)
		es := httptest.NewServer(eng)
		t.Cleanup(es.Close)
		urls = append(urls, es.URL)
	}
	g, _ := newAuditGateway(t, Config{AuditHeaders: true}, "cache_aware_hash", policy.DefaultConfig(), 0)
	evictionDrill(t, g, urls[0], urls[1], 1000/5) // the sim counts about 4 bytes a token
}

// TestAnEvictedPromptGoesWhereTheCostSaysOnLLMDSim: evictionDrill on two llm-d-inference-sim
// engines (skipped where it is absent) of 256 KV blocks of 16 tokens: the case, where a
// prompt an engine evicted went back to it for a full prefill while another engine held it.
func TestAnEvictedPromptGoesWhereTheCostSaysOnLLMDSim(t *testing.T) {
	var urls []string
	for range 2 {
		e := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--enable-kvcache", "--kv-cache-size", "256",
			"--block-size", "16", "--max-num-seqs", "8", "--max-model-len", "16384", "--mode", "random", "--seed", "7")
		urls = append(urls, e.URL)
	}
	g, _ := newAuditGateway(t, Config{AuditHeaders: true}, "cache_aware_hash", policy.DefaultConfig(), 0)
	// How many of its tokens the engine counts in 100 of the drill's words.
	_, b := testutil.MustPostOK(t, urls[1]+"/v1/completions", "", `{"model":"m","prompt":"`+strings.Repeat("round-9-prompt-9 ", 100)+`","max_tokens":1}`)
	tokens, _, ok := answerTokens(b)
	if !ok || tokens < 50 {
		t.Fatalf("the engine's answer reports no usage: %s", b)
	}
	evictionDrill(t, g, urls[0], urls[1], 1000*100/tokens)
}
