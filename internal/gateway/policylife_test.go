package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
)

// multiModelServer is one loopback server that plays many workers: a worker registered at
// URL/NAME serves the model NAME.
func multiModelServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			model, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"sglang"}]}`, model)
			return
		}
		defaultInference(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// goroutinesIn counts the goroutines whose stack names fn. The profile groups goroutines with
// the same stack into one record that starts with their count.
func goroutinesIn(fn string) int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if !strings.Contains(g, fn) {
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if c, _, ok := strings.Cut(line, " @ "); ok {
				k, _ := strconv.Atoi(c)
				n += k
			}
		}
	}
	return n
}

func chatFor(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`
}

// TestModelsThatLeaveReleaseTheirPolicies: a model whose last worker leaves takes its policy,
// the policy's goroutine and its metric series with it.
func TestModelsThatLeaveReleaseTheirPolicies(t *testing.T) {
	srv := multiModelServer(t)
	g := newTestGateway(t, Config{}, "cache_aware")
	before := goroutinesIn("evictLoop")
	const models = 40
	for i := range models {
		m := fmt.Sprintf("leaving-%d", i)
		w, err := g.Register(context.Background(), AddWorkerRequest{URL: srv.URL + "/" + m})
		if err != nil {
			t.Fatal(err)
		}
		resp := g.postBounded(t, "/v1/chat/completions", chatFor(m))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("model %s: status %d", m, resp.StatusCode)
		}
		g.waitDone(t, 1)
		if _, err := g.reg.Remove(w.ID); err != nil {
			t.Fatal(err)
		}
	}
	if n := goroutinesIn("evictLoop") - before; n > 0 {
		t.Errorf("%d eviction goroutines left behind by %d models that are gone", n, models)
	}
	if n := countSeries(t, g, func(l map[string]string) bool { return strings.HasPrefix(l["model"], "leaving-") }); n > 0 {
		t.Errorf("%d metric series left behind by models that are gone", n)
	}
}

// TestPolicyFollowsTheLabels: a model's policy is the label of its first registered worker that
// has one, and it is rebuilt when that changes; not fixed by whoever came first on the first
// request.
func TestPolicyFollowsTheLabels(t *testing.T) {
	srv := multiModelServer(t)
	g := newTestGateway(t, Config{}, "random")
	servedBy := func() string {
		t.Helper()
		resp := g.postBounded(t, "/v1/chat/completions", chatFor("m"))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		g.waitDone(t, 1)
		seen := map[string]bool{}
		if mf := family(t, g, "kvgate_policy_selections_total"); mf != nil {
			for _, m := range mf.GetMetric() {
				if ls := labelsOf(m); ls["model"] == "m" {
					seen[ls["policy"]] = true
				}
			}
		}
		for _, name := range []string{"round_robin", "least_load", "random"} {
			if seen[name] {
				return name
			}
		}
		t.Fatalf("no selection recorded: %v", seen)
		return ""
	}
	a, err := g.Register(context.Background(), AddWorkerRequest{URL: srv.URL + "/m", Labels: map[string]string{"policy": "round_robin"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := servedBy(); got != "round_robin" {
		t.Fatalf("policy %s, want the label's round_robin", got)
	}
	g.mustRegister(t, AddWorkerRequest{URL: srv.URL + "/m/b", ModelID: "m", Labels: map[string]string{"policy": "least_load"}})
	if _, err := g.reg.Remove(a.ID); err != nil {
		t.Fatal(err)
	}
	if got := servedBy(); got != "least_load" {
		t.Errorf("policy %s after the round_robin worker left, want least_load from the remaining worker's label", got)
	}
}
