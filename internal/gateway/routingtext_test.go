package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestASharedOpeningLongerThanTheRoutingText: every prompt opens with the same 3,000 bytes,
// longer than the gateway's routing text (RoutingPrefixBytes 1,024 here). Two sessions' first
// turns were served, each on its own `kvgate sim` engine (the other one out of routing
// meanwhile), until the gateway's tree holds the whole opening for both. Each session's next
// turn then goes back to the engine that holds it, which answers it with its first turn cached;
// with FixedRoutingText the routing text is all opening, and the gateway predicts the same share
// on both engines: it cannot tell the sessions apart.
func TestASharedOpeningLongerThanTheRoutingText(t *testing.T) {
	open := strings.Repeat("the shared system prompt ", 120)
	turn1 := []string{open + strings.Repeat("session zero ", 200), open + strings.Repeat("session one ", 200)}
	for _, fixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
				cfg := Config{AuditHeaders: true, RoutingPrefixBytes: 1024, FixedRoutingText: fixed}
				g, _ := newAuditGatewayOn(t, mn, cfg, "cache_aware_hash", policy.DefaultConfig(), 0)
				ws := make([]*worker.Worker, 2)
				for i := range ws {
					eng := sim.NewServer(sim.Config{Model: "m"})
					t.Cleanup(eng.Close)
					es := mn.NewServer(eng)
					t.Cleanup(es.Close)
					w, err := g.Register(context.Background(), AddWorkerRequest{URL: es.URL})
					if err != nil {
						t.Fatal(err)
					}
					ws[i] = w
				}
				complete := func(prompt string) (tok, cached int, cost string) {
					t.Helper()
					body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
					h, b := testutil.PostOKVia(t, g.client, g.srv.URL+"/v1/completions", g.bearer, body)
					if h == nil {
						t.FailNow()
					}
					g.waitDone(t, 1)
					p, c, _ := answerTokens(b)
					return p, c, h.Get("X-Kvgate-Cost") + " | " + h.Get("X-Kvgate-Cost-Runner-Up")
				}
				// Three rounds of first turns, session i on engine i alone: the first records,
				// cut at 1 KiB, show that much of the opening shared, the next reach further.
				tokens := make([]int, 2)
				for range 3 {
					for i, text := range turn1 {
						ws[1-i].SetHealth(worker.NotReady)
						tokens[i], _, _ = complete(text)
						ws[1-i].SetHealth(worker.Ready)
					}
				}
				for i, text := range turn1 {
					p, cached, cost := complete(text + " and the next question")
					switch {
					case !fixed && cached < tokens[i]-engine.DefaultConfig().BlockSize:
						// The engine caches whole blocks: all of the first turn but its last part block.
						t.Errorf("session %d's next turn: %d of %d tokens cached, want its first turn's %d (%s)", i, cached, p, tokens[i], cost)
					case fixed && !equalCached(cost):
						t.Errorf("fixed routing text: session %d's terms differ in c between the engines (%s); the opening alone cannot tell them", i, cost)
					}
				}
			})
		})
	}
}

// equalCached reports whether the chosen and the runner-up terms of an audit pair ("… c=X … |
// … c=Y …") predict the same cached tokens.
func equalCached(pair string) bool {
	c := func(s string) string {
		for _, f := range strings.Fields(s) {
			if strings.HasPrefix(f, "c=") {
				return f
			}
		}
		return ""
	}
	a, b, _ := strings.Cut(pair, " | ")
	return c(a) != "" && c(a) == c(b)
}

// TestAHugePromptKeepsABoundedRoutingText: of a prompt of 4 MiB the gateway decodes its first
// RoutingPrefixBytes (8 KiB) of routing text; only once the tree holds all of those for two
// workers is it parsed again, for 4 × RoutingPrefixBytes (32 KiB), and its routing text is no
// longer than that. With FixedRoutingText it stays 8 KiB.
func TestAHugePromptKeepsABoundedRoutingText(t *testing.T) {
	s := &Server{cfg: DefaultConfig()}
	past := s.cfg.RoutingPrefixBytes
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("a", 4<<20) + `"}`)
	p, err := parseBody(body, nil, kindCompletion, past)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Text) != past || p.TextBytes != 4<<20 {
		t.Fatalf("parsed %d bytes of routing text of %d, want %d of %d", len(p.Text), p.TextBytes, past, 4<<20)
	}
	cfg := policy.DefaultConfig()
	cfg.NoBackground = true
	pol, err := policy.New("cache_aware_hash", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pol.(interface{ Close() error }).Close()
	if got := len(s.routingText(pol, body, &p)); got != past {
		t.Fatalf("routing text of %d bytes on an empty tree, want %d", got, past)
	}
	for i := range 2 {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://10.0.0.%d:8000", i+1)}, worker.BreakerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		pol.(policy.Recorder).Record(&policy.Request{Model: "m", Text: strings.Repeat("a", 8*past)}, w)
	}
	if got := len(s.routingText(pol, body, &p)); got != 4*past {
		t.Fatalf("routing text of %d bytes where the tree holds 64 KiB of it for two workers, want %d", got, 4*past)
	}
	s.cfg.FixedRoutingText = true
	if got := len(s.routingText(pol, body, &p)); got != past {
		t.Fatalf("fixed: routing text of %d bytes, want %d", got, past)
	}
}
