package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
)

// auditHeadersOf sends a chat request with the given bearer ("" = none) and returns its audit
// headers.
func auditHeadersOf(t *testing.T, g *testGateway, bearer, content string) (worker, route, predicted string) {
	t.Helper()
	h, _ := testutil.MustPostOK(t, g.srv.URL+"/v1/chat/completions", bearer, `{"model":"m","messages":[{"role":"user","content":"`+content+`"}]}`)
	return h.Get(headerWorker), h.Get(headerRoute), h.Get(headerPredicted)
}

// The audit headers go only to a request carrying the admin key or a key named in
// AuditHeadersClients; a keyless client, another key or a wrong key is served without them.
// Before, every data-plane client saw them.
func TestAuditHeadersOnlyForPermittedClients(t *testing.T) {
	t.Run("open data plane, admin key", func(t *testing.T) {
		g, _ := newAuditGateway(t, Config{AuditHeaders: true, AdminKey: "adm"}, "cache_aware", policy.DefaultConfig(), 2)
		if w, r, p := auditHeadersOf(t, g, "", "hello there"); w != "" || r != "" || p != "" {
			t.Fatalf("a keyless client got audit headers %q %q %q", w, r, p)
		}
		if w, _, _ := auditHeadersOf(t, g, "not-the-key", "hello there"); w != "" {
			t.Fatalf("a wrong key got x-kvgate-worker %q", w)
		}
		if w, r, _ := auditHeadersOf(t, g, "adm", "hello there"); w == "" || r == "" {
			t.Fatal("the admin key got no audit headers")
		}
	})
	t.Run("named data-plane keys", func(t *testing.T) {
		cfg := Config{AuditHeaders: true, APIKeys: []string{"alice=a-secret", "bob=b-secret"}, AuditHeadersClients: []string{"alice"}}
		g, _ := newAuditGateway(t, cfg, "cache_aware", policy.DefaultConfig(), 2)
		if w, _, _ := auditHeadersOf(t, g, "b-secret", "hello there"); w != "" {
			t.Fatalf("bob, not named, got x-kvgate-worker %q", w)
		}
		if w, _, _ := auditHeadersOf(t, g, "a-secret", "hello there"); w == "" {
			t.Fatal("alice, named, got no audit headers")
		}
	})
}

// The prefix-probing attack: a client sends the opening of another user's prompt plus one
// guessed character and reads x-kvgate-predicted-hit. With three decimals the right guess read
// 1.000 and every wrong one 0.995, so 256 probes recovered 20 characters. Now a keyless client
// reads nothing, and even a permitted one reads the same value for every guess.
func TestAuditPrefixProbingReadsNothing(t *testing.T) {
	cfg := Config{AuditHeaders: true, APIKeys: []string{"=open", "ops=ops-secret"}, AuditHeadersClients: []string{"ops"}}
	g, _ := newAuditGateway(t, cfg, "cache_aware", policy.DefaultConfig(), 2)
	secret := strings.Repeat("the quarterly numbers are ", 8) + "kiwi"
	auditHeadersOf(t, g, "open", secret) // the victim's request fills a prefix tree
	known := secret[:len(secret)-4]
	// Each probe joins the tree too: the permitted client probes first, on a tree that holds only
	// the victim's prompt, as an attacker would.
	guesses := "abcdefghijklmnopqrstuvwxyz"
	for _, c := range []struct{ who, key string }{{"a permitted client", "ops-secret"}, {"a client not named", "open"}} {
		seen := map[string]int{}
		for _, ch := range guesses {
			_, _, p := auditHeadersOf(t, g, c.key, known+string(ch))
			seen[p]++
		}
		if c.key == "open" && (len(seen) != 1 || seen[""] != len(guesses)) {
			t.Fatalf("%s read predicted shares %v", c.who, seen)
		}
		if len(seen) != 1 {
			t.Fatalf("%s told guesses apart: %v (the right one is %q)", c.who, seen, secret[len(known)])
		}
	}
}

// x-kvgate-worker is a keyed hash: not the worker id (a hash of its URL that a client could
// invert by trying addresses), the same on replicas given one key, and shown by the admin API.
func TestAuditWorkerIDIsOpaque(t *testing.T) {
	key := "0123456789abcdef-shared"
	a, _ := newAuditGateway(t, Config{AuditHeaders: true, AuditIDKey: key}, "round_robin", policy.DefaultConfig(), 1)
	wid := a.reg.View().All[0].ID
	got, _, _ := auditHeadersOf(t, a, a.bearer, "x")
	if got == "" || got == wid || strings.Contains(got, wid) || len(got) != 16 {
		t.Fatalf("x-kvgate-worker %q for worker %s: want 16 hex digits unlike the id", got, wid)
	}
	if newAuditIDs(key).of(wid) != got { // what another replica given the key computes
		t.Error("two replicas with one key name the worker differently")
	}
	if newAuditIDs("").of(wid) == got {
		t.Error("a random key gave the configured key's id")
	}
	f := newFakeWorker(t, "m")
	w, err := a.Register(context.Background(), AddWorkerRequest{URL: f.URL})
	if err != nil {
		t.Fatal(err)
	}
	var info WorkerInfo
	raw, _ := json.Marshal(a.info(w))
	json.Unmarshal(raw, &info)
	if info.AuditID != a.auditIDs.of(w.ID) {
		t.Fatalf("admin API audit_id %q, want %q", info.AuditID, a.auditIDs.of(w.ID))
	}
}

func TestAuditConfigValidation(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		bad  string
	}{
		{"nobody could see them", Config{AuditHeaders: true}, "no client could see them"},
		{"unknown client", Config{AuditHeaders: true, APIKeys: []string{"a=1"}, AuditHeadersClients: []string{"b"}}, `no data-plane key is named "b"`},
		{"short id key", Config{AuditHeaders: true, AdminKey: "k", AuditIDKey: "short"}, "at least 16 bytes"},
		{"admin key", Config{AuditHeaders: true, AdminKey: "k"}, ""},
		{"named client", Config{AuditHeaders: true, APIKeys: []string{"a=1"}, AuditHeadersClients: []string{"a"}}, ""},
		{"off", Config{AuditHeadersClients: []string{"nobody"}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.bad == "" && err != nil || c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)) {
				t.Fatalf("Validate: %v, want %q", err, c.bad)
			}
		})
	}
}

// The cost headers of the cost-based policies name workers by their audit ids and give Ĉ in
// tenths of the prompt, with the cost computed from it: no header gives a worker id or Ĉ to the
// token.
func TestAuditCostHeadersBlunted(t *testing.T) {
	ids := newAuditIDs("0123456789abcdef-k")
	req := &policy.Request{Decision: policy.Decision{Worker: "w1", HasCost: true,
		Chosen:   policy.Terms{Worker: "w1", Prompt: 100, Cached: 37, Behind: 0.5, Rate: 1000, Decode: 0.01, Cost: 0.1045},
		RunnerUp: policy.Terms{Worker: "w2", Queued: 50, Prompt: 100, Rate: 1000, Cost: 0.15}}}
	a := newAuditWriter(httptest.NewRecorder(), req, 0, "cache_aware_hash", &ids)
	h := http.Header{}
	a.renderDecision(h)
	chosen, runner := h.Get(headerCost), h.Get(headerCostRunnerUp)
	if want := "worker=" + ids.of("w1") + " q=0 s=0 p=100 c=40 b=0.50 mu=1000 d=0.010 cost=0.100 follow=0 credit=0"; chosen != want {
		t.Errorf("cost header %q, want %q", chosen, want)
	}
	if !strings.HasPrefix(runner, "worker="+ids.of("w2")+" ") || strings.Contains(runner, "w2 ") {
		t.Errorf("runner-up header %q", runner)
	}
	if got := h.Get(headerWorker); got != ids.of("w1") {
		t.Errorf("x-kvgate-worker %q", got)
	}
}
