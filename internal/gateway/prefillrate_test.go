package gateway

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// polledGateway is a gateway running the default policy on a load monitor that polls only when
// the test says (PollOnce), over one worker at url of runtime rt; the audit headers are on for
// its bearer.
func polledGateway(t *testing.T, url, rt string) (srv *httptest.Server, mon *loadmon.Monitor, w *worker.Worker, bearer string) {
	t.Helper()
	return polledGatewayOn(t, nil, url, rt)
}

// polledGatewayOn is polledGateway on the in-memory network mn (nil: loopback).
func polledGatewayOn(t *testing.T, mn *testutil.MemNet, url, rt string) (srv *httptest.Server, mon *loadmon.Monitor, w *worker.Worker, bearer string) {
	t.Helper()
	reg := worker.NewRegistry()
	mcfg := loadmon.Config{Interval: time.Hour, Mode: loadmon.ModeScaled}
	cfg := Config{AuditHeaders: true, Logger: slog.New(slog.DiscardHandler)}
	if mn != nil {
		mcfg.Transport, cfg.Proxy.Transport = mn.Transport(), mn.Transport()
	}
	mon = loadmon.New(reg, mcfg)
	pc := policy.DefaultConfig()
	pc.NoBackground, pc.Loads = true, mon
	pc.Cost.RateFromCounters = true // the tests read μ from the counters (off by default)
	router := newRouter(t, "cache_aware_hash", pc)
	bearer = auditClient(&cfg)
	s := New(cfg, reg, router, mon)
	if _, err := s.Register(context.Background(), AddWorkerRequest{URL: url, Runtime: rt}); err != nil {
		t.Fatal(err)
	}
	srv = newServerOn(mn, s.Handler())
	t.Cleanup(srv.Close)
	mon.PollOnce(context.Background())
	return srv, mon, reg.View().All[0], bearer
}

// simGatewayOn is polledGatewayOn in front of one `kvgate sim` engine of flavor (its runtime too)
// prefilling at rate tokens/s, both on the in-memory network mn.
func simGatewayOn(t *testing.T, mn *testutil.MemNet, flavor string, rate float64) (srv *httptest.Server, mon *loadmon.Monitor, w *worker.Worker, bearer string) {
	t.Helper()
	eng := sim.NewServer(sim.Config{Model: "m", Flavor: flavor, Engine: engine.Config{PrefillTPS: rate}})
	t.Cleanup(eng.Close)
	es := mn.NewServer(eng)
	t.Cleanup(es.Close)
	return polledGatewayOn(t, mn, es.URL, flavor)
}

// TestPrefillRateFromLLMDSimCounters: llm-d-inference-sim (skipped where absent) prefills at
// 1 ms a token and reports only vLLM's Prometheus metrics; after one round of load the gateway
// reads its prefill rate from them, and the next decision's x-kvgate-cost prices it (mu=…), not
// the 8,000 tokens/s default. The engine times its prefill on the wall clock, so a loaded
// machine can only make it slower: the rate must be within 20 % above 1,000 tokens/s, and at
// least 400 (read 598 once beside a full -race suite; 952–978 on a quiet box).
func TestPrefillRateFromLLMDSimCounters(t *testing.T) {
	eng := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--mode", "random", "--seed", "7",
		"--max-num-seqs", "8", "--max-model-len", "16384", "--latency-calculator", "per-token",
		"--prefill-overhead", "5ms", "--prefill-time-per-token", "1ms", "--inter-token-latency", "1ms")
	srv, mon, w, bearer := polledGateway(t, eng.URL, "")

	post := func(i int) http.Header {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":%q}]}`,
			fmt.Sprintf("prompt %d ", i)+strings.Repeat("some words to prefill ", 60))
		h, _ := testutil.PostOK(t, srv.URL+"/v1/chat/completions", bearer, body) // on other goroutines too
		return h
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { post(i) })
	}
	wg.Wait()
	mon.PollOnce(context.Background())
	r, ok := mon.Report(w)
	if !ok || r.PrefillRate < minLLMDRate || r.PrefillRate > 1200 {
		t.Fatalf("prefill rate %.0f (report %v), want the engine's 1,000 (at most 1,200, at least %d):\n%+v", r.PrefillRate, ok, minLLMDRate, r)
	}
	cost := post(99).Get(headerCost)
	t.Logf("x-kvgate-cost: %s; report prefill_rate %.0f", cost, r.PrefillRate)
	if mup := costField(t, cost, "mup"); mup < minLLMDRate || mup > 1200 {
		t.Fatalf("the decision priced the prompt at mup=%v (%q), want the engine's 1,000 (at most 1,200, at least %d)", mup, cost, minLLMDRate)
	}
	// The queue is not priced at one prompt's rate: an engine of 8 slots drains it faster.
	if mu := costField(t, cost, "mu"); mu != 8000 {
		t.Fatalf("the decision priced the queue at mu=%v (%q), want the 8,000 default until the queue's falls measure it", mu, cost)
	}
}

// costField returns the value of name= in an x-kvgate-cost header.
func costField(t *testing.T, cost, name string) float64 {
	t.Helper()
	for _, f := range strings.Fields(cost) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("x-kvgate-cost %q: %s=%q", cost, name, v)
			}
			return x
		}
	}
	t.Fatalf("x-kvgate-cost %q has no %s", cost, name)
	return 0
}

// minLLMDRate is the least prefill rate TestPrefillRateFromLLMDSimCounters accepts, in tokens/s:
// far below the engine's 1,000 but far above nothing, and far from the 8,000 default.
const minLLMDRate = 400

// TestPrefillRateFromSimVLLMCounters: `kvgate sim --flavor vllm` exports the same counters, so
// the gateway reads its prefill rate from /metrics (which has no queued uncached tokens): the
// engine's configured rate, within 1 %, since engine, gateway and polls run in a synctest bubble
// on testutil.MemNet and the engine's prefill is timed on the bubble's clock.
func TestPrefillRateFromSimVLLMCounters(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const rate = 20000 // tokens/s
		srv, mon, w, bearer := simGatewayOn(t, mn, sim.FlavorVLLM, rate)
		client := mn.Client()
		for i := range 3 {
			body := fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":%q}`, fmt.Sprintf("prompt %d ", i)+strings.Repeat("x", 16000))
			if h, _ := testutil.PostOKVia(t, client, srv.URL+"/v1/completions", bearer, body); h == nil {
				t.FailNow()
			}
		}
		mon.PollOnce(context.Background())
		r, ok := mon.Report(w)
		if !ok || r.PrefillRate < 0.99*rate || r.PrefillRate > 1.01*rate {
			t.Fatalf("prefill rate %.0f (report %v), want %d ± 1 %%:\n%+v", r.PrefillRate, ok, rate, r)
		}
		t.Logf("prefill rate %.1f", r.PrefillRate)
	})
}

// TestPrefillRateWhileHitsDecode: llm-d-inference-sim counts a prompt's tokens when the request
// finishes but its prefix-cache queries, hits and prefill time when its first token leaves. A
// poll taken while four requests that hit the cache still decode must read the rate from the
// queries less the hits: the prompt tokens less the hits went back by the hits, which read as
// a restarted engine and no rate at all (and, summed over polls, from 935 to 36,600 tokens/s on
// four identical engines).
func TestPrefillRateWhileHitsDecode(t *testing.T) {
	eng := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--mode", "random", "--seed", "7",
		"--max-num-seqs", "8", "--max-model-len", "16384", "--latency-calculator", "per-token",
		"--enable-kvcache", "--kv-cache-size", "2048", "--block-size", "16",
		"--prefill-overhead", "5ms", "--prefill-time-per-token", "1ms", "--inter-token-latency", "1ms")
	srv, mon, w, bearer := polledGateway(t, eng.URL, "")
	prompt := func(i int) string { return fmt.Sprintf("prompt %d ", i) + strings.Repeat("some words to prefill ", 60) }
	var wg sync.WaitGroup
	for i := range 4 { // four misses: the counters' first interval
		wg.Go(func() {
			testutil.PostOK(t, srv.URL+"/v1/chat/completions", bearer,
				fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":%q}]}`, prompt(i)))
		})
	}
	wg.Wait()
	mon.PollOnce(context.Background())

	// The same four prompts again, each decoding for seconds: poll once each has its first token.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 4)
	for i := range 4 {
		go func() {
			body := fmt.Sprintf(`{"model":"m","max_tokens":5000,"ignore_eos":true,"stream":true,"messages":[{"role":"user","content":%q}]}`, prompt(i))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+bearer)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				first <- err
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"content"`) {
					first <- nil
					for sc.Scan() { // decode on until the test ends
					}
					return
				}
			}
			first <- fmt.Errorf("stream ended before a token: status %d, %v", resp.StatusCode, sc.Err())
		}()
	}
	for range 4 {
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	}
	mon.PollOnce(context.Background())
	r, _ := mon.Report(w)
	t.Logf("while four hits decode: prompt tokens %d, queries %d, hits %d, prefill %.3f s, rate %.0f",
		r.PromptTokensTotal, r.PrefixQueryTokensTotal, r.PrefixHitTokensTotal, r.PrefillSecondsTotal, r.PrefillRate)
	if r.PrefixHitTokensTotal == 0 {
		t.Fatalf("no prefix-cache hits counted: %+v", r)
	}
	if r.PrefillRate < minLLMDRate || r.PrefillRate > 1200 {
		t.Fatalf("prefill rate %.0f while the hits decode, want the engine's 1,000 (at most 1,200, at least %d)", r.PrefillRate, minLLMDRate)
	}
}

// TestQueueRateFromSGLangBusyCounters: `kvgate sim --flavor sglang` serves SGLang's cumulative
// prefill counters in /v1/loads (total_prefill_uncached_tokens, total_prefill_busy_us), so one
// poll interval in which the engine prefilled measures μ, the rate it drains its queue at: the
// next decision prices the queue at the engine's 20,000 tokens/s, not at the 8,000 default that
// the backlog's falls would keep for four intervals. Engine, gateway and polls run in a synctest
// bubble on testutil.MemNet, the engine timed on the bubble's clock.
func TestQueueRateFromSGLangBusyCounters(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const rate = 20000 // tokens/s
		srv, mon, _, bearer := simGatewayOn(t, mn, sim.FlavorSGLang, rate)
		client := mn.Client()
		post := func(i int) http.Header {
			body := fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":%q}`, fmt.Sprintf("prompt %d ", i)+strings.Repeat("x", 16000))
			h, _ := testutil.PostOKVia(t, client, srv.URL+"/v1/completions", bearer, body)
			return h
		}
		var wg sync.WaitGroup
		for i := range 8 { // 32,000 tokens: 1.6 s of prefill
			wg.Go(func() { post(i) })
		}
		time.Sleep(500 * time.Millisecond) // the bubble's clock: half a second of prefill
		mon.PollOnce(context.Background())
		cost := post(99).Get(headerCost)
		wg.Wait()
		t.Logf("x-kvgate-cost: %s", cost)
		if mu := costField(t, cost, "mu"); mu < 0.95*rate || mu > 1.05*rate {
			t.Fatalf("the decision priced the queue at mu=%v (%q), want the engine's %d ± 5 %%", mu, cost, rate)
		}
	})
}
