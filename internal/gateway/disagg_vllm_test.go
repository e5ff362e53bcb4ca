package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/worker"
)

// pdSim is one vLLM-flavoured simulated engine behind a server that counts the requests carrying
// each role's kv_transfer_params.
type pdSim struct {
	srv              *httptest.Server
	prefill, decodes atomic.Int64
}

func startPDSim(t *testing.T) *pdSim {
	t.Helper()
	e := sim.NewServer(sim.Config{Model: "m", Flavor: sim.FlavorVLLM,
		Engine: engine.Config{DecodeBase: time.Millisecond, PrefillTPS: 1e6}})
	t.Cleanup(e.Close)
	p := &pdSim{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			s := string(b)
			switch {
			case strings.Contains(s, `"do_remote_decode":true`):
				p.prefill.Add(1)
			case strings.Contains(s, `"do_remote_prefill":true`):
				p.decodes.Add(1)
			}
			r.Body = io.NopCloser(strings.NewReader(s))
		}
		e.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// A vLLM prefill/decode pool speaks the two-step protocol: every request, streamed or not,
// through the official SDK, is prefilled on a prefill worker and decoded with the parameters it
// answered; a prefill worker that dies mid-run costs no request.
func TestVLLMDisaggregatedTwoStep(t *testing.T) {
	pre := []*pdSim{startPDSim(t), startPDSim(t)}
	dec := startPDSim(t)
	router := newRouter(t, "cache_aware_hash", policy.DefaultConfig())
	s := New(Config{Logger: slog.New(slog.DiscardHandler),
		Proxy: proxy.Config{Retry: proxy.RetryConfig{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}}},
		worker.NewRegistry(), router, nil)
	for _, a := range []AddWorkerRequest{{URL: pre[0].srv.URL, WorkerType: "prefill"}, {URL: pre[1].srv.URL, WorkerType: "prefill"}, {URL: dec.srv.URL, WorkerType: "decode"}} {
		if _, err := s.Register(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.pdProtocol(s.reg.View().Pool("m")); got != PDVLLM {
		t.Fatalf("protocol %q for a vLLM pool, want vllm", got)
	}
	gw := httptest.NewServer(s.Handler())
	t.Cleanup(gw.Close)
	c := openai.NewClient(option.WithBaseURL(gw.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := t.Context()
	prompt := strings.Repeat("a long shared system prompt for the pair ", 20)
	ask := func(i int, stream bool) {
		t.Helper()
		params := openai.ChatCompletionNewParams{Model: "m", MaxTokens: openai.Int(5),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt + strings.Repeat("x", i))}}
		if !stream {
			got, err := c.Chat.Completions.New(ctx, params)
			if err != nil || got.Usage.CompletionTokens != 5 {
				t.Fatalf("request %d: %v (%d tokens)", i, err, got.Usage.CompletionTokens)
			}
			return
		}
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := c.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		if err := st.Err(); err != nil || acc.Usage.CompletionTokens != 5 {
			t.Fatalf("stream %d: %v (%d tokens) %+v", i, err, acc.Usage.CompletionTokens, err)
		}
		if acc.Usage.PromptTokensDetails.CachedTokens < acc.Usage.PromptTokens/2 {
			t.Errorf("stream %d: decode reports %d of %d prompt tokens cached: the KV was not taken as transferred",
				i, acc.Usage.PromptTokensDetails.CachedTokens, acc.Usage.PromptTokens)
		}
	}
	for i := range 6 {
		ask(i, i%2 == 0)
	}
	if n := pre[0].prefill.Load() + pre[1].prefill.Load(); n != 6 || dec.decodes.Load() != 6 {
		t.Fatalf("%d prefills and %d decodes with transfer parameters, want 6 and 6", n, dec.decodes.Load())
	}
	// A prefill worker dies: its requests are prefilled by the other, or by the decode worker.
	pre[0].srv.CloseClientConnections()
	pre[0].srv.Close()
	for i := 6; i < 14; i++ {
		ask(i, i%2 == 1)
	}
}

func TestParsePDProtocol(t *testing.T) {
	for in, want := range map[string]string{"": PDAuto, "VLLM": PDVLLM, " sglang ": PDSGLang, "auto": PDAuto} {
		if got, err := ParsePDProtocol(in); err != nil || got != want {
			t.Errorf("%q: %q, %v", in, got, err)
		}
	}
	if _, err := ParsePDProtocol("nixl2"); err == nil {
		t.Error("unknown protocol accepted")
	}
}
