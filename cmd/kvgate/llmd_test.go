package main

// KV-cache events from llm-d-inference-sim, a vLLM simulator nobody here wrote (skipped where its
// binary is absent), in both of vLLM's encodings, through kvgate serve as an operator starts it.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// The engine dials the gateway's --kv-events-bind (so the gateway starts first, and the engine
// is registered through the admin API once it runs); a prompt the engine served directly is then
// predicted from its events alone, whichever encoding it uses.
func TestLLMDKVEventsBothEncodings(t *testing.T) {
	for _, enc := range []string{"array", "map"} {
		t.Run(enc, func(t *testing.T) {
			g := startLLMDEventGateway(t, "m", llmdEventArgs(enc)...)
			prompt := strings.Repeat("events from an engine we did not write ", 12)
			g.serveDirect(t, "m", prompt)
			g.waitPredicted(t, "m", prompt)
		})
	}
}

// llmdEventArgs are the engine flags of a 512-block KV cache publishing events in encoding enc
// ("array" or "map"), then extra.
func llmdEventArgs(enc string, extra ...string) []string {
	args := []string{"--enable-kvcache", "--kv-cache-size", "512", "--block-size", "16"}
	if enc == "map" {
		args = append(args, "--use-vllm-map-event-format")
	}
	return append(args, extra...)
}

// llmdEventGateway is a gateway binding --kv-events-bind and one llm-d-inference-sim engine
// dialing it, registered through the admin API.
type llmdEventGateway struct {
	addrs listenAddrs
	e     *testutil.LLMDSim
	msgs  chan struct{} // one send per event message handled
}

// startLLMDEventGateway starts the gateway, then the engine for model with args (and the
// gateway's bind as its --zmq-endpoint), and registers it.
func startLLMDEventGateway(t *testing.T, model string, args ...string) *llmdEventGateway {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bind := "tcp://" + l.Addr().String()
	l.Close()
	o, err := parseServe([]string{"--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "0",
		"--admin-key", "adminsecret", "--kv-events-bind", bind, "--api-key", "audit=auditsecret", "--audit-headers",
		"--audit-headers-clients", "audit", "--worker-urls", "http://127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g := &llmdEventGateway{msgs: make(chan struct{}, 1<<12)}
	o.kv.events.AfterMessage = func() { g.msgs <- struct{}{} }
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o.gw.Logger = log
	ctx, cancel := context.WithCancel(context.Background())
	done, ready := make(chan error, 1), make(chan listenAddrs, 1)
	go func() { done <- serve(ctx, o, log, ready) }()
	t.Cleanup(func() { cancel(); testutil.Recv(t, done, "the gateway's exit") })
	g.addrs = testutil.Recv(t, ready, "the gateway's listeners")
	g.e = testutil.StartLLMDSim(t, model, append(args, "--zmq-endpoint", bind)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})
	reg, _ := http.NewRequest(http.MethodPost, "http://"+g.addrs.admin+"/workers", strings.NewReader(fmt.Sprintf(`{"url":%q}`, g.e.URL)))
	reg.Header.Set("Authorization", "Bearer adminsecret")
	reg.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(reg)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("registering the engine: %v %v", err, resp)
	}
	resp.Body.Close()
	return g
}

// serveDirect has the engine serve prompt for model directly, so that only its events tell the
// gateway, and waits for an event message.
func (g *llmdEventGateway) serveDirect(t *testing.T, model, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":%q}`, model, prompt)
	testutil.MustPostOK(t, g.e.URL+"/v1/completions", "", body)
	testutil.Recv(t, g.msgs, "an event message from the engine")
}

// route sends prompt for model through the gateway and returns its audit headers' route and
// predicted hit.
func (g *llmdEventGateway) route(t *testing.T, model, prompt string) (route string, hit float64) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":%q}`, model, prompt)
	h, _ := testutil.MustPostOK(t, "http://"+g.addrs.api+"/v1/completions", "auditsecret", body)
	hit, _ = strconv.ParseFloat(h.Get("X-Kvgate-Predicted-Hit"), 64)
	return h.Get("X-Kvgate-Route"), hit
}

// waitPredicted sends prompt for model through the gateway until it is predicted from the
// engine's events (a precise hit of at least half the prompt), within a bound.
func (g *llmdEventGateway) waitPredicted(t *testing.T, model, prompt string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		route, hit := g.route(t, model, prompt)
		if strings.HasSuffix(route, "precise_hit") && hit >= 0.5 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("model %q: the gateway never predicted the engine's events: route %q, predicted %v", model, route, hit)
		}
		select {
		case <-g.msgs:
		case <-time.After(100 * time.Millisecond):
		}
	}
}
