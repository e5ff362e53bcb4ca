package gateway

// Tests against llm-d-inference-sim, a vLLM simulator nobody here wrote (testutil.StartLLMDSim;
// skipped where its binary is absent). They check what a user sees: answers, through the
// official SDK, from the right engines.

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// llmdGateway is a gateway of lora (load-on-demand) with a load monitor in front of engines
// registered as regs.
func llmdGateway(t *testing.T, lora LoRAConfig, regs ...AddWorkerRequest) (*Server, *loadmon.Monitor, openai.Client) {
	t.Helper()
	reg := worker.NewRegistry()
	mon := loadmon.New(reg, loadmon.Config{Interval: time.Hour})
	pcfg := policy.DefaultConfig()
	pcfg.Loads = mon
	router := newRouter(t, "cache_aware_hash", pcfg)
	s := New(Config{Logger: slog.New(slog.DiscardHandler), LoRA: lora,
		Proxy: proxy.Config{Retry: proxy.RetryConfig{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}}},
		reg, router, mon)
	for _, a := range regs {
		if _, err := s.Register(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	mon.PollOnce(context.Background())
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, mon, openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
}

func streamChat(t *testing.T, c openai.Client, model, prompt string) openai.ChatCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil || len(acc.Choices) == 0 {
		t.Fatalf("stream for %s: %v", model, err)
	}
	return acc.ChatCompletion
}

// LoRA against vLLM's simulator: adapters and their parent come from its /v1/models, its
// lora_requests_info reaches the cost, a request for an adapter goes only to the engine that
// serves it, and one loaded at run time and registered again is routed too.
func TestLLMDLoRARouting(t *testing.T) {
	both := testutil.StartLLMDSim(t, "base", "--zmq-endpoint", "", "--max-loras", "2",
		"--lora-modules", `{"name":"a","path":"/a"}`, `{"name":"b","path":"/b"}`)
	onlyB := testutil.StartLLMDSim(t, "base", "--zmq-endpoint", "", "--max-loras", "2",
		"--lora-modules", `{"name":"b","path":"/b"}`)
	s, mon, c := llmdGateway(t, LoRAConfig{}, AddWorkerRequest{URL: both.URL}, AddWorkerRequest{URL: onlyB.URL})
	v := s.reg.View()
	if p := v.Pool("a"); p == nil || p.Parent != "base" || len(p.Regular) != 1 {
		t.Fatalf("pool a from the engines' /v1/models: %+v", p)
	}
	for _, w := range v.All {
		r, ok := mon.Report(w)
		if !ok || r.LoRA == nil || r.LoRA.MaxLoras != 2 {
			t.Fatalf("worker %s: no lora_requests_info in its report (%+v, %v)", w.Spec.URL, r.LoRA, ok)
		}
	}
	for i := range 6 {
		if got := streamChat(t, c, "a", strings.Repeat("tell me about adapters ", i+1)); got.Model != "a" {
			t.Fatalf("answer from model %q", got.Model)
		}
		streamChat(t, c, "b", strings.Repeat("and about b ", i+1))
	}
	for _, w := range v.All {
		if w.Spec.URL == onlyB.URL && w.Processed() > 6 {
			t.Errorf("the engine without adapter a served %d requests, more than b's", w.Processed())
		}
	}
}

// vLLM P/D against vLLM's simulator, which plays both roles by kv_transfer_params: every request,
// streamed or not, is answered through the two-step protocol, and a prefill engine killed
// mid-run costs no request.
func TestLLMDDisaggregated(t *testing.T) {
	p1 := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--kv-cache-transfer-latency", "5ms")
	p2 := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--kv-cache-transfer-latency", "5ms")
	d := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--kv-cache-transfer-latency", "5ms")
	s, _, c := llmdGateway(t, LoRAConfig{}, AddWorkerRequest{URL: p1.URL, WorkerType: "prefill"},
		AddWorkerRequest{URL: p2.URL, WorkerType: "prefill"}, AddWorkerRequest{URL: d.URL, WorkerType: "decode"})
	if got := s.pdProtocol(s.reg.View().Pool("m")); got != PDVLLM {
		t.Fatalf("protocol %q, want vllm (the engines say owned_by vllm)", got)
	}
	ctx := t.Context()
	ask := func(i int) {
		prompt := strings.Repeat("disaggregated ", 10+i)
		if i%2 == 0 {
			streamChat(t, c, "m", prompt)
			return
		}
		got, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
		if err != nil || len(got.Choices) == 0 {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	for i := range 6 {
		ask(i)
	}
	if n := remoteDecodes(t, p1.URL) + remoteDecodes(t, p2.URL); n != 6 {
		t.Fatalf("the prefill engines ran %d prefills for remote decode, want 6", n)
	}
	p1.Stop()
	for i := 6; i < 14; i++ {
		ask(i)
	}
}

// remoteDecodes is the prefills an llm-d-inference-sim engine answered for a remote decode, from
// its vllm:request_success_total{finish_reason="remote_decode"}.
func remoteDecodes(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "vllm:request_success_total{") && strings.Contains(line, `finish_reason="remote_decode"`) {
			f := strings.Fields(line)
			n, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return int(n)
		}
	}
	return 0
}

// The engine's /tokenize answers the KV-event tokenizer that precise_prefix uses.
func TestLLMDTokenize(t *testing.T) {
	e := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "")
	w, err := worker.New(worker.Spec{URL: e.URL, Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tok := kvevents.NewTokenizer(kvevents.TokenizerConfig{})
	toks, err := tok.Tokenize(t.Context(), w, "m", false, nil, "hello world, tokenized by another engine")
	if err != nil || len(toks) < 3 {
		t.Fatalf("tokens %v, %v", toks, err)
	}
}

// Load-on-demand against vLLM's simulator: an allowed adapter no engine lists is loaded on one
// through its /v1/load_lora_adapter, then served.
func TestLLMDLoraLoadOnDemand(t *testing.T) {
	e1 := testutil.StartLLMDSim(t, "base", "--zmq-endpoint", "", "--max-loras", "2")
	e2 := testutil.StartLLMDSim(t, "base", "--zmq-endpoint", "", "--max-loras", "2")
	_, _, c := llmdGateway(t, LoRAConfig{OnDemand: true, Sources: map[string]string{"x": "/adapters/x"}},
		AddWorkerRequest{URL: e1.URL}, AddWorkerRequest{URL: e2.URL})
	for i := range 3 {
		if got := streamChat(t, c, "x", strings.Repeat("adapter on demand ", i+1)); got.Model != "x" {
			t.Fatalf("answer from model %q", got.Model)
		}
	}
	if n := countListing(t, "x", e1.URL, e2.URL); n != 1 {
		t.Fatalf("the adapter is listed by %d engines, want 1", n)
	}
}
