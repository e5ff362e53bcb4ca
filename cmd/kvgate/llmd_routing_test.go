package main

// Routing quality live against llm-d-inference-sim, a vLLM simulator nobody here wrote (skipped
// where its binary is absent): the fleet of its README, behind one gateway as an operator starts
// it, driven by kvgate bench.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestLLMDLongContextKeepsPrefixesWhereTheyAre: 4 engines of 8 slots, 2,048 KV blocks of 16
// tokens, 1 ms a prompt token, and 48 contexts of ~2k tokens at 16 requests/s: the working set
// fits the fleet once, so the default policy keeps each context on one engine (hit 0.986, TTFT
// p99 ~60 ms on an idle box). Pricing the queue at each prompt's own prefill rate (μ from the
// engines' counters, 1,000 tokens/s where an engine of 8 slots drains 8,000) spread the contexts
// over the engines: hit 0.59–0.77, p99 2.2–3.6 s. The bounds leave room for a loaded CI box.
func TestLLMDLongContextKeepsPrefixesWhereTheyAre(t *testing.T) {
	if testing.Short() {
		t.Skip("a 40 s live run")
	}
	var urls []string
	for range 4 {
		e := testutil.StartLLMDSim(t, "sim-model", "--mode", "random", "--max-num-seqs", "8", "--max-model-len", "16384",
			"--enable-kvcache", "--kv-cache-size", "2048", "--block-size", "16", "--latency-calculator", "per-token",
			"--prefill-overhead", "10ms", "--prefill-time-per-token", "1ms", "--inter-token-latency", "5ms",
			"--seed", "7", "--zmq-endpoint", "")
		urls = append(urls, e.URL)
	}
	o, err := parseServe([]string{"--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "0",
		"--admin-key", "adminsecret", "--api-key", "bench=benchsecret", "--worker-urls", strings.Join(urls, ",")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	o.gw.Logger = log
	ctx, cancel := context.WithCancel(context.Background())
	done, ready := make(chan error, 1), make(chan listenAddrs, 1)
	go func() { done <- serve(ctx, o, log, ready) }()
	t.Cleanup(func() { cancel(); testutil.Recv(t, done, "the gateway's exit") })
	addrs := testutil.Recv(t, ready, "the gateway's listeners")

	var out, errb bytes.Buffer
	args := []string{"bench", "--target", "http://" + addrs.api, "--api-key", "benchsecret", "--ignore-eos",
		"--workload", "long-context", "--prefixes", "48", "--prefix-words", "2000", "--rate", "16",
		"--duration", "40s", "--warmup", "20s", "--json"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("bench: %v\n%s", err, errb.String())
	}
	var rep struct {
		Rows []bench.Summary `json:"rows"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Rows) != 1 {
		t.Fatalf("bench report (%v):\n%s", err, out.String())
	}
	r := rep.Rows[0]
	t.Logf("%d ok, %d errors, hit %.3f, TTFT p50 %.1f ms, p99 %.1f ms", r.OK, r.Errors, r.HitRate, r.TTFTP50, r.TTFTP99)
	if r.Errors > 0 || r.OK < 200 {
		t.Fatalf("%d ok, %d errors (%v): want every request served", r.OK, r.Errors, r.ErrorKinds)
	}
	if r.HitRate < 0.9 || r.TTFTP99 > 1000 {
		t.Fatalf("hit %.3f, TTFT p99 %.0f ms: want ≥ 0.9 and ≤ 1,000 ms (the contexts stay on the engines that hold them)", r.HitRate, r.TTFTP99)
	}
}
