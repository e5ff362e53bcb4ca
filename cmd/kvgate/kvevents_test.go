package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// eventRig is simulated engines publishing KV-cache events and gateway replicas routing with
// precise_prefix, each dialing every engine's publisher.
type eventRig struct {
	fleet    *sim.Fleet
	gateways []string        // API addresses
	handled  []chan struct{} // per gateway: one send per event message handled
	seen     []int           // per gateway: messages handled so far
}

func startEventRig(t *testing.T, engines, replicas int) *eventRig {
	t.Helper()
	return startEventRigWith(t, engines, replicas, nil)
}

// startEventRigWith is startEventRig with the engines' configuration changed by edit (nil: none).
func startEventRigWith(t *testing.T, engines, replicas int, edit func(*sim.Config)) *eventRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := sim.Config{MaxTokens: 2, Events: sim.Events{Port: -1}}
	cfg.Engine = engine.Config{KVTokens: 96 * 16, PrefillTPS: 1e7, DecodeBase: time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	fleet, err := sim.StartFleet(ctx, engines, "127.0.0.1", 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &eventRig{fleet: fleet}
	args := []string{"--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "-1", "--policy", "precise_prefix",
		"--worker-urls", strings.Join(fleet.URLs(), ","), "--tokenizer-timeout", "5s"}
	for i, s := range fleet.Servers() {
		pub, _ := s.EventsAddr()
		args = append(args, "--worker-label", fmt.Sprintf("kv_events_endpoint=tcp://%s@%s", pub, fleet.URLs()[i]))
	}
	var stopped []chan error
	for range replicas {
		o, err := parseServe(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan struct{}, 1<<16)
		o.kv.events.AfterMessage = func() { ch <- struct{}{} }
		log := slog.New(slog.DiscardHandler)
		o.gw.Logger = log
		ready, done := make(chan listenAddrs, 1), make(chan error, 1)
		go func() { done <- serve(ctx, o, log, ready) }()
		select {
		case a := <-ready:
			r.gateways = append(r.gateways, a.api)
		case err := <-done:
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatal("a gateway did not start")
		}
		r.handled, r.seen = append(r.handled, ch), append(r.seen, 0)
		stopped = append(stopped, done)
	}
	t.Cleanup(func() {
		cancel()
		for _, d := range stopped {
			testutil.Recv(t, d, "a gateway's exit")
		}
		fleet.Close()
	})
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	for _, s := range fleet.Servers() {
		if err := s.WaitEventSubscribers(wctx, replicas); err != nil {
			t.Fatalf("gateways did not subscribe: %v", err)
		}
	}
	return r
}

// sync waits until every gateway has handled every batch the engines published so far. Call it
// when no request is in flight (engines publish only while serving).
func (r *eventRig) sync(t *testing.T) {
	t.Helper()
	var total int
	for _, s := range r.fleet.Servers() {
		total += int(s.EventsPublished())
	}
	for g := range r.handled {
		for r.seen[g] < total {
			select {
			case <-r.handled[g]:
				r.seen[g]++
			case <-time.After(10 * time.Second):
				t.Fatalf("gateway %d handled %d of %d event batches", g, r.seen[g], total)
			}
		}
	}
}

// ask sends a prompt to base (a gateway or an engine) and returns the cached prompt tokens.
func ask(t *testing.T, base, prompt string) int64 {
	t.Helper()
	return askModel(t, base, sim.DefaultModel, prompt)
}

// askModel is ask for model (an adapter's name, or the base model's).
func askModel(t *testing.T, base, model, prompt string) int64 {
	t.Helper()
	c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(model),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	return res.Usage.PromptTokensDetails.CachedTokens
}

// longPrompt is a distinct prompt of 640 tokens (40 blocks; an engine holds 96).
func longPrompt(name string) string {
	return strings.Repeat(fmt.Sprintf("%-16s", name), 160)
}

// Two gateway replicas, each subscribed to every engine, send a prompt to the engine that holds
// it although neither sent it there (it was served by the engine directly) and they never
// exchanged anything; and after that engine evicts the prompt, a replica whose prefix tree
// still believes in it sends it to the engine that holds it now.
func TestPreciseRoutingFollowsEngineEvents(t *testing.T) {
	r := startEventRig(t, 3, 2)
	engines := r.fleet.URLs()
	prompts := []string{longPrompt("alpha"), longPrompt("bravo"), longPrompt("charlie")}
	for i, p := range prompts {
		ask(t, engines[i], p) // engine i holds prompt i; no gateway saw it
	}
	r.sync(t)
	for g, gw := range r.gateways {
		for i, p := range prompts {
			if c := ask(t, "http://"+gw, p); c < 600 {
				t.Fatalf("replica %d sent prompt %d elsewhere than engine %d, its holder (%d cached tokens)", g, i, i, c)
			}
		}
	}

	// Engine 0 evicts prompt 0 (three other 40-block prompts push it out of its 96 blocks,
	// least recently used first); engine 1 gets it. Replica 0's tree still says engine 0.
	for _, s := range []string{"x", "y", "z"} {
		ask(t, engines[0], longPrompt(s))
	}
	ask(t, engines[1], prompts[0])
	r.sync(t)
	if c := ask(t, "http://"+r.gateways[0], prompts[0]); c < 600 {
		t.Fatalf("after engine 0 evicted prompt 0, replica 0 did not send it to engine 1 (%d cached tokens)", c)
	}
}

// --kv-events-bind beyond loopback needs --kv-events-allowed-hosts; with it, the start-up log
// says who may connect and publish.
func TestKVEventsBindNeedsAllowedHosts(t *testing.T) {
	o, err := parseServe([]string{"--kv-events-bind", "tcp://0.0.0.0:0", "--worker-urls", "http://127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	reg := worker.NewRegistry()
	log := slog.New(slog.DiscardHandler)
	if _, _, err := startKVEvents(&o.kv, reg, log); err == nil || !strings.Contains(err.Error(), "--kv-events-allowed-hosts") {
		t.Fatalf("a bind beyond loopback without an allow-list started: %v", err)
	}
	o, err = parseServe([]string{"--kv-events-bind", "tcp://0.0.0.0:0", "--kv-events-allowed-hosts", "10.0.0.0/16, 127.0.0.1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.kv.events.AllowedHosts; len(got) != 2 || got[0] != "10.0.0.0/16" {
		t.Fatalf("allowed hosts %q", got)
	}
	var logs strings.Builder
	_, stop, err := startKVEvents(&o.kv, reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.Contains(logs.String(), "open_to=\"connections from 10.0.0.0/16, 127.0.0.1\"") {
		t.Fatalf("start-up log:\n%s", logs.String())
	}
}
