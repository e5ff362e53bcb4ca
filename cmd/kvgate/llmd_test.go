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
			msgs := make(chan struct{}, 1<<12)
			o.kv.events.AfterMessage = func() { msgs <- struct{}{} }
			var logs testutil.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			o.gw.Logger = log
			ctx, cancel := context.WithCancel(context.Background())
			done, ready := make(chan error, 1), make(chan listenAddrs, 1)
			go func() { done <- serve(ctx, o, log, ready) }()
			t.Cleanup(func() { cancel(); testutil.Recv(t, done, "the gateway's exit") })
			addrs := testutil.Recv(t, ready, "the gateway's listeners")

			args := []string{"--enable-kvcache", "--kv-cache-size", "512", "--block-size", "16", "--zmq-endpoint", bind}
			if enc == "map" {
				args = append(args, "--use-vllm-map-event-format")
			}
			e := testutil.StartLLMDSim(t, "m", args...)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway log:\n%s", logs.String())
				}
			})
			reg, _ := http.NewRequest(http.MethodPost, "http://"+addrs.admin+"/workers", strings.NewReader(fmt.Sprintf(`{"url":%q}`, e.URL)))
			reg.Header.Set("Authorization", "Bearer adminsecret")
			reg.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(reg)
			if err != nil || resp.StatusCode/100 != 2 {
				t.Fatalf("registering the engine: %v %v", err, resp)
			}
			resp.Body.Close()

			prompt := strings.Repeat("events from an engine we did not write ", 12)
			body := fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":%q}`, prompt)
			// The engine serves the prompt directly: only its events tell the gateway.
			resp, err = http.Post(e.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			testutil.Recv(t, msgs, "an event message from the engine")
			deadline := time.Now().Add(10 * time.Second)
			for {
				req, _ := http.NewRequest(http.MethodPost, "http://"+addrs.api+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer auditsecret")
				req.Header.Set("Content-Type", "application/json")
				resp, err = http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				route, hit := resp.Header.Get("X-Kvgate-Route"), resp.Header.Get("X-Kvgate-Predicted-Hit")
				if h, _ := strconv.ParseFloat(hit, 64); resp.StatusCode == 200 && strings.HasSuffix(route, "precise_hit") && h >= 0.5 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the gateway never predicted the engine's events: status %d, route %q, predicted %q", resp.StatusCode, route, hit)
				}
				select {
				case <-msgs:
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
}
