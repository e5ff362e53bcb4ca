package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// listsModel reports whether the engine at base lists model in its /v1/models.
func listsModel(t *testing.T, base, model string) bool {
	t.Helper()
	return listsModelVia(t, http.DefaultClient, base, model)
}

// listsModelVia is listsModel through client.
func listsModelVia(t *testing.T, client *http.Client, base, model string) bool {
	t.Helper()
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	for _, m := range list.Data {
		if m.ID == model {
			return true
		}
	}
	return false
}

// An allowed adapter no worker lists is loaded on one worker of the base model, from the
// allow-list's source, and served there from then on; an adapter not allowed is a 404 and is
// never loaded.
func TestLoraLoadOnDemand(t *testing.T) {
	engines := []*httptest.Server{startLoraSim(t, ""), startLoraSim(t, "")}
	router := newRouter(t, "cache_aware_hash", policy.DefaultConfig())
	srcs, err := ParseLoRASources("x=/adapters/x")
	if err != nil {
		t.Fatal(err)
	}
	reg := worker.NewRegistry()
	s := New(Config{Logger: slog.New(slog.DiscardHandler), LoRA: LoRAConfig{OnDemand: true, Sources: srcs}}, reg, router, nil)
	for _, e := range engines {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: e.URL}); err != nil {
			t.Fatal(err)
		}
	}
	gw := httptest.NewServer(s.Handler())
	t.Cleanup(gw.Close)
	c := openai.NewClient(option.WithBaseURL(gw.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	for i := range 4 {
		got, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "x", MaxTokens: openai.Int(2),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("load me ", i+1))}})
		if err != nil || got.Model != "x" {
			t.Fatalf("request %d for the adapter loaded on demand: %v", i, err)
		}
	}
	loaded := 0
	for _, e := range engines {
		if listsModel(t, e.URL, "x") {
			loaded++
		}
	}
	if p := reg.View().Pool("x"); loaded != 1 || p == nil || p.Parent != "base" || len(p.Regular) != 1 {
		t.Fatalf("adapter loaded on %d engines, pool %+v; want one", loaded, p)
	}
	_, err = c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "y", MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("not allowed")}})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("an adapter off the allow-list: %v, want 404", err)
	}
	for _, e := range engines {
		if listsModel(t, e.URL, "y") {
			t.Error("an adapter off the allow-list was loaded")
		}
	}
}

func TestParseLoRASources(t *testing.T) {
	for _, bad := range []string{"x", "=p", "x=", "x=a,x=b", "x=\"q"} {
		if _, err := ParseLoRASources(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	m, err := ParseLoRASources(" a=/p/a , b=s3://bucket/b ")
	if err != nil || m["a"] != "/p/a" || m["b"] != "s3://bucket/b" {
		t.Errorf("%v %v", m, err)
	}
}

func FuzzParseLoRASources(f *testing.F) {
	f.Add("a=/p/a,b=/p/b")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseLoRASources(s)
		if err != nil {
			return
		}
		for k, v := range m {
			if k == "" || v == "" || strings.ContainsAny(k+v, "\"\n") {
				t.Fatalf("accepted %q=%q", k, v)
			}
		}
	})
}
