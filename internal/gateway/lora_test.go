package gateway

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// startLoraSim serves a vLLM-flavoured simulated engine of base model "base" with the adapters
// named (name=path, comma-separated).
func startLoraSim(t *testing.T, modules string) *httptest.Server {
	t.Helper()
	return startLoraSimOn(t, nil, modules)
}

// startLoraSimOn is startLoraSim on the in-memory network mn (nil: loopback).
func startLoraSimOn(t *testing.T, mn *testutil.MemNet, modules string) *httptest.Server {
	t.Helper()
	ms, err := sim.ParseLoraModules(modules)
	if err != nil {
		t.Fatal(err)
	}
	e := sim.NewServer(sim.Config{Model: "base", Flavor: sim.FlavorVLLM, LoraModules: ms})
	t.Cleanup(e.Close)
	srv := newServerOn(mn, e)
	t.Cleanup(srv.Close)
	return srv
}

// Adapters are learned from each worker's /v1/models with their parent; a request for an adapter
// goes only to the workers that list it, and the policy is told it names an adapter.
func TestLoraAdaptersRouteOnlyToTheirWorkers(t *testing.T) {
	both := startLoraSim(t, "a=/p/a,b=/p/b")
	onlyB := startLoraSim(t, "b=/p/b")
	router := newRouter(t, "cache_aware_hash", policy.DefaultConfig())
	reg := worker.NewRegistry()
	s := New(Config{Logger: slog.New(slog.DiscardHandler)}, reg, router, nil)
	for _, u := range []string{both.URL, onlyB.URL} {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	v := reg.View()
	if p := v.Pool("a"); p == nil || p.Parent != "base" || len(p.Regular) != 1 || p.Regular[0].Spec.URL != both.URL {
		t.Fatalf("pool a: %+v", p)
	}
	if p := v.Pool("b"); p == nil || p.Parent != "base" || len(p.Regular) != 2 {
		t.Fatalf("pool b: %+v", p)
	}
	if p := v.Pool("base"); p == nil || p.Parent != "" {
		t.Fatalf("pool base: %+v", p)
	}
	gw := httptest.NewServer(s.Handler())
	t.Cleanup(gw.Close)
	c := openai.NewClient(option.WithBaseURL(gw.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := t.Context()
	for i := range 8 {
		got, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "a",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("question ", i+1))},
			MaxTokens: openai.Int(2),
		})
		if err != nil || got.Model != "a" {
			t.Fatalf("request %d for adapter a: %v (model %q)", i, err, got.Model)
		}
	}
	for _, w := range v.All {
		if w.Spec.URL == onlyB.URL && w.Processed() != 0 {
			t.Errorf("the worker without adapter a served %d of its requests", w.Processed())
		}
	}
	if got := adapterOf(v.Pool("a")); got != "a" {
		t.Errorf("adapterOf(pool a) = %q", got)
	}
	if got := adapterOf(v.Pool("base")); got != "" {
		t.Errorf("adapterOf(pool base) = %q", got)
	}
}
