package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// loraGateway starts a gateway with cfg in front of engines and returns it with an SDK client.
func loraGateway(t *testing.T, cfg Config, engines ...*httptest.Server) (*Server, *worker.Registry, openai.Client) {
	t.Helper()
	return loraGatewayOn(t, nil, cfg, engines...)
}

// loraGatewayOn is loraGateway on the in-memory network mn (nil: loopback).
func loraGatewayOn(t *testing.T, mn *testutil.MemNet, cfg Config, engines ...*httptest.Server) (*Server, *worker.Registry, openai.Client) {
	t.Helper()
	client := http.DefaultClient
	if mn != nil {
		client, cfg.Proxy.Transport = mn.Client(), mn.Transport()
	}
	router := newRouter(t, "cache_aware_hash", policy.DefaultConfig())
	reg := worker.NewRegistry()
	s := New(cfg, reg, router, nil)
	t.Cleanup(s.Stop)
	for _, e := range engines {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: e.URL}); err != nil {
			t.Fatal(err)
		}
	}
	gw := newServerOn(mn, s.Handler())
	t.Cleanup(gw.Close)
	return s, reg, openai.NewClient(option.WithBaseURL(gw.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0), option.WithHTTPClient(client))
}

func adapterChat(c openai.Client, ctx context.Context, model, text string) error {
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}})
	return err
}

// When the one worker serving an allowed adapter is past saturation (here: one request in
// flight, with a saturation point of one), the next request for the adapter has the gateway load
// a second copy on another worker of the base model, without waiting for it; the adapter's pool
// then holds both, and a request that finds a copy with room adds none.
//
// It runs in a synctest bubble on testutil.MemNet: the states it waits for (the long request in
// flight, the second copy) are checked once every goroutine is idle, not polled.
func TestLoraCopyWhenSaturated(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		ms, _ := sim.ParseLoraModules("x=/adapters/x")
		slow := sim.NewServer(sim.Config{Model: "base", Flavor: sim.FlavorVLLM, LoraModules: ms,
			Engine: engine.Config{DecodeBase: 20 * time.Millisecond}})
		t.Cleanup(slow.Close)
		e1 := mn.NewServer(slow)
		t.Cleanup(e1.Close)
		e2, e3 := startLoraSimOn(t, mn, ""), startLoraSimOn(t, mn, "")
		srcs, _ := ParseLoRASources("x=/adapters/x")
		var logs testutil.SyncBuffer
		cfg := Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), LoRA: LoRAConfig{OnDemand: true, Sources: srcs},
			Flow: FlowConfig{Config: flow.Config{Saturation: flow.Saturation{DefaultSlots: 1, MaxWaiting: -1}}}}
		_, reg, c := loraGatewayOn(t, mn, cfg, e1, e2, e3)
		// A request while the copy has room loads nothing.
		if err := adapterChat(c, t.Context(), "x", "room on the one copy"); err != nil {
			t.Fatal(err)
		}
		if n := len(reg.View().Pool("x").Regular); n != 1 {
			t.Fatalf("a copy with room: %d copies, want 1", n)
		}
		long := make(chan error, 1)
		go func() {
			_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "x", MaxTokens: openai.Int(60),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a long answer holds the copy")}})
			long <- err
		}()
		w1 := reg.View().Pool("x").Regular[0]
		synctest.Wait() // the long request is at the engine, decoding on the bubble's clock
		if n := w1.Inflight(); n != 1 {
			t.Fatalf("%d requests in flight on the copy, want the long one", n)
		}
		if err := adapterChat(c, t.Context(), "x", "the copy is saturated"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the load of the second copy, which the request did not wait for
		if n := len(reg.View().Pool("x").Regular); n != 2 {
			t.Fatalf("%d copies after a request found the one saturated, want 2", n)
		}
		if err := testutil.Recv(t, long, "the long request"); err != nil {
			t.Fatal(err)
		}
		if loaded := countListingVia(t, mn.Client(), "x", e2.URL, e3.URL); loaded != 1 {
			t.Fatalf("the copy is on %d engines, want 1", loaded)
		}
		if n := strings.Count(logs.String(), "adapter loaded on demand"); n != 1 {
			t.Fatalf("%d loads logged, want 1:\n%s", n, logs.String())
		}
	})
}

// With --lora-max-loaded 1, a load that finds every worker at the bound unloads the adapter idle
// longest past --lora-idle-unload and loads on its worker; while none is idle enough, the load is
// refused (503), and that state is logged once, however many loads find it.
func TestLoraUnloadsIdleForRoom(t *testing.T) {
	e1, e2 := startLoraSim(t, ""), startLoraSim(t, "")
	srcs, _ := ParseLoRASources("x=/adapters/x,y=/adapters/y,z=/adapters/z")
	clock := testutil.NewClock(time.Unix(1000, 0))
	var logs testutil.SyncBuffer
	cfg := Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		LoRA: LoRAConfig{OnDemand: true, Sources: srcs, MaxLoaded: 1, IdleUnload: 10 * time.Minute, Now: clock.Now}}
	_, reg, c := loraGateway(t, cfg, e1, e2)
	for _, m := range []string{"x", "y"} {
		if err := adapterChat(c, t.Context(), m, "load "+m); err != nil {
			t.Fatal(err)
		}
	}
	holderX := reg.View().Pool("x").Regular[0]
	if reg.View().Pool("y").Regular[0] == holderX {
		t.Fatal("x and y on one worker despite the bound of one")
	}
	for range 2 {
		if err := adapterChat(c, t.Context(), "z", "no room"); err == nil || !strings.Contains(err.Error(), "503") {
			t.Fatalf("a load with no room and nothing idle: %v, want 503", err)
		}
	}
	clock.Advance(11 * time.Minute)
	if err := adapterChat(c, t.Context(), "y", "y stays busy"); err != nil {
		t.Fatal(err)
	}
	if err := adapterChat(c, t.Context(), "z", "room now"); err != nil {
		t.Fatal(err)
	}
	v := reg.View()
	if v.Pool("x") != nil || v.Pool("z") == nil || v.Pool("z").Regular[0] != holderX {
		t.Fatalf("after the unload: x pool %v, z pool %v; want x gone and z on x's worker", v.Pool("x"), v.Pool("z"))
	}
	if u := holderX.URL.String(); listsModel(t, u, "x") || !listsModel(t, u, "z") {
		t.Fatal("the engine did not unload x and load z")
	}
	log := logs.String()
	if strings.Count(log, "every worker holds its most adapters") != 1 || strings.Count(log, "idle adapter unloaded") != 1 ||
		strings.Count(log, "has room for an adapter") != 1 {
		t.Fatalf("transitions logged wrongly:\n%s", log)
	}
}
