package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// cachingInference answers like an engine with a prefix cache: a prompt it has seen before is
// reported fully cached in usage (non-streaming, and in the usage chunk when the client asks
// for one).
func cachingInference() http.HandlerFunc {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream   bool `json:"stream"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		var text strings.Builder
		for _, m := range req.Messages {
			text.WriteString(m.Content)
		}
		mu.Lock()
		hit := seen[text.String()]
		seen[text.String()] = true
		mu.Unlock()
		prompt := max(text.Len()/4, 1)
		cached := 0
		if hit {
			cached = prompt
		}
		usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`, prompt, prompt+2, cached)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],"usage":%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":%s}\n\n", usage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// newAuditGateway is a gateway over n caching fake workers with pc's policy knobs.
func newAuditGateway(t *testing.T, cfg Config, name string, pc policy.Config, n int) (*testGateway, []*fakeWorker) {
	t.Helper()
	return newAuditGatewayOn(t, nil, cfg, name, pc, n)
}

// newAuditGatewayOn is newAuditGateway on the in-memory network mn (nil: loopback).
func newAuditGatewayOn(t *testing.T, mn *testutil.MemNet, cfg Config, name string, pc policy.Config, n int) (*testGateway, []*fakeWorker) {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Proxy.Retry = proxy.RetryConfig{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	pc.NoBackground = true
	ws := make([]*fakeWorker, n)
	for i := range ws {
		ws[i] = newFakeWorkerOn(t, mn, "m")
		ws[i].setHandler(cachingInference())
	}
	return newGatewayOver(t, mn, cfg, newRouter(t, name, pc), ws...), ws
}

// histogram returns the sample count and sum of kvgate_prefix_prediction_error.
func predictionHistogram(t *testing.T, s *Server) (count uint64, sum float64, unverified float64) {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvgate_prefix_prediction_error":
				count += m.GetHistogram().GetSampleCount()
				sum += m.GetHistogram().GetSampleSum()
			case "kvgate_prefix_prediction_unverified_total":
				unverified += m.GetCounter().GetValue()
			}
		}
	}
	return count, sum, unverified
}

// TestAuditHeadersAndPredictionError: with --audit-headers the response names the worker, the
// branch and the predicted share; the prediction is compared with the cached_tokens the worker
// reports, non-streaming and streamed, through the official client.
func TestAuditHeadersAndPredictionError(t *testing.T) {
	g, _ := newAuditGateway(t, Config{AuditHeaders: true}, "cache_aware", policy.DefaultConfig(), 2)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("tell me about caches ", 20) + `"}]}`
	ids := map[string]bool{}
	for _, w := range g.reg.View().All {
		ids[g.auditIDs.of(w.ID)] = true
	}
	for i, want := range []struct{ route, predicted string }{
		{"cache_aware/cache_miss", "0.0"},
		{"cache_aware/cache_hit", "1.0"},
	} {
		resp := g.post(t, "/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		if w := resp.Header.Get("X-Kvgate-Worker"); !ids[w] {
			t.Fatalf("request %d: x-kvgate-worker %q is not a worker id", i, w)
		}
		if r := resp.Header.Get("X-Kvgate-Route"); r != want.route {
			t.Fatalf("request %d: x-kvgate-route %q, want %q", i, r, want.route)
		}
		if p := resp.Header.Get("X-Kvgate-Predicted-Hit"); p != want.predicted {
			t.Fatalf("request %d: x-kvgate-predicted-hit %q, want %q", i, p, want.predicted)
		}
	}
	g.waitDone(t, 2) // the prediction is observed after the body is relayed: wait for the handlers
	count, sum, _ := predictionHistogram(t, g.Server)
	if count != 2 || sum != 0 {
		t.Fatalf("prediction error: %d samples summing to %v, want 2 exact predictions", count, sum)
	}

	// Streamed, through the official client with include_usage: the usage chunk is read.
	c := openai.NewClient(option.WithBaseURL(g.srv.URL+"/v1/"), option.WithAPIKey(g.bearer), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{
		Model:         "m",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("a streamed question ", 30))},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	for i := 0; i < 2; i++ {
		var hdr http.Header
		stream := c.Chat.Completions.NewStreaming(context.Background(), params, option.WithResponseInto(new(*http.Response)), option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if resp != nil {
				hdr = resp.Header
			}
			return resp, err
		}))
		var usage openai.CompletionUsage
		for stream.Next() {
			if ch := stream.Current(); ch.Usage.PromptTokens > 0 {
				usage = ch.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if want := int64(i) * usage.PromptTokens; usage.PromptTokensDetails.CachedTokens != want {
			t.Fatalf("stream %d: cached %d, want %d", i, usage.PromptTokensDetails.CachedTokens, want)
		}
		if hdr.Get("X-Kvgate-Route") == "" {
			t.Fatalf("stream %d: no audit header", i)
		}
	}
	g.waitDone(t, 2)
	count, sum, _ = predictionHistogram(t, g.Server)
	if count != 4 || sum != 0 {
		t.Fatalf("after two streams: %d samples summing to %v, want 4 exact predictions", count, sum)
	}
}

// TestAuditHeadersOffByDefault: without the flag no routing detail leaks, and the prediction is
// still measured; a body too large to look at is counted as unverified, not buffered.
func TestAuditHeadersOffByDefault(t *testing.T) {
	g, ws := newAuditGateway(t, Config{}, "cache_aware", policy.DefaultConfig(), 1)
	big := strings.Repeat("x", auditBodyMax)
	ws[0].setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`, big)
	})
	resp := g.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"content":"hello"}]}`)
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n < auditBodyMax {
		t.Fatalf("relayed %d bytes, want the whole body", n)
	}
	g.waitDone(t, 1)
	for _, h := range []string{"X-Kvgate-Worker", "X-Kvgate-Route", "X-Kvgate-Predicted-Hit"} {
		if v := resp.Header.Get(h); v != "" {
			t.Fatalf("%s = %q without --audit-headers", h, v)
		}
	}
	count, _, unverified := predictionHistogram(t, g.Server)
	if count != 0 || unverified != 1 {
		t.Fatalf("%d samples, %v unverified: want the large body unverified", count, unverified)
	}
}

// TestStickySessionsThroughGateway: with sticky sessions around round_robin, each session
// (x-session-id header, or the body's user) stays on one worker; keyless requests rotate.
func TestStickySessionsThroughGateway(t *testing.T) {
	pc := policy.DefaultConfig()
	pc.Sticky.Enabled = true
	g, _ := newAuditGateway(t, Config{AuditHeaders: true}, "round_robin", pc, 4)
	workerOf := func(body string, hdr ...string) (string, string) {
		resp := g.post(t, "/v1/chat/completions", body, hdr...)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Kvgate-Worker"), resp.Header.Get("X-Kvgate-Route")
	}
	for s := 0; s < 6; s++ {
		byHeader, _ := workerOf(`{"model":"m","messages":[{"content":"q"}]}`, "X-Session-Id", fmt.Sprintf("h-%d", s))
		userBody := fmt.Sprintf(`{"model":"m","user":"u-%d","messages":[{"content":"q"}]}`, s)
		byUser, _ := workerOf(userBody)
		for turn := 0; turn < 3; turn++ {
			if w, route := workerOf(`{"model":"m","messages":[{"content":"q2"}]}`, "X-Session-Id", fmt.Sprintf("h-%d", s)); w != byHeader || route != "round_robin/sticky" {
				t.Fatalf("session h-%d moved from %s to %s (%s)", s, byHeader, w, route)
			}
			if w, _ := workerOf(userBody); w != byUser {
				t.Fatalf("user u-%d moved from %s to %s", s, byUser, w)
			}
		}
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		w, _ := workerOf(`{"model":"m","messages":[{"content":"q"}]}`)
		seen[w] = true
	}
	if len(seen) != 4 {
		t.Fatalf("keyless requests reached %d workers, want 4", len(seen))
	}
}

func TestUsageShare(t *testing.T) {
	cases := []struct {
		in    string
		share float64
		ok    bool
	}{
		{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}`, 0.4, true},
		{"data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\": {\"prompt_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n", 1, true},
		{`{"usage":{"prompt_tokens":10}}`, 0, false},                                            // no cached_tokens: unknown, not zero
		{`{"usage":{"prompt_tokens":0,"prompt_tokens_details":{"cached_tokens":0}}}`, 0, false}, // nothing to share
		{`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":9}}}`, 1, true},  // clamped
		{`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":`, 0, false},     // cut
		{`{"text":"the word \"usage\" in content"}`, 0, false},                                  // not a key
		{`{"usage":null}`, 0, false},
	}
	for _, c := range cases {
		s, ok := usageShare([]byte(c.in))
		if ok != c.ok || s != c.share {
			t.Errorf("usageShare(%q) = %v, %v; want %v, %v", c.in, s, ok, c.share, c.ok)
		}
	}
}

func FuzzUsageShare(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`"usage" : [`))
	f.Add([]byte(`{"usage":{"Prompt_Tokens":10,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":20}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1e1,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4.0}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens_details":null}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens_details":{}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":"10","prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":99999999999999999999,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":null}}}`))
	f.Add([]byte(`{"response":{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":2}}}`))
	f.Add([]byte(`{"usage":{"input_tokens":10,"prompt_tokens":0,"input_tokens_details":{"cached_tokens":4}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, ok := usageShare(b)
		if ok && (s < 0 || s > 1) {
			t.Fatalf("share %v out of [0,1]", s)
		}
		u, ok := usageIn(b)
		wu, wok := usageInJSON(b)
		if ok != wok || (ok && !reflect.DeepEqual(u, wu)) {
			t.Fatalf("usageIn(%q) = %s, %v; encoding/json reads %s, %v", b, showUsage(u), ok, showUsage(wu), wok)
		}
	})
}

// usageInJSON is usageIn with encoding/json, the reference its scan must agree with.
func usageInJSON(b []byte) (auditUsage, bool) {
	var u auditUsage
	v, ok := usageValue(b)
	if !ok {
		return u, false
	}
	if err := json.NewDecoder(bytes.NewReader(v)).Decode(&u); err == nil && u.PromptTokens > 0 {
		return u, true
	}
	var r struct { // the Responses API's names
		InputTokens        int           `json:"input_tokens"`
		InputTokensDetails *auditDetails `json:"input_tokens_details"`
	}
	if err := json.NewDecoder(bytes.NewReader(v)).Decode(&r); err != nil {
		return auditUsage{}, false
	}
	u = auditUsage{PromptTokens: r.InputTokens, PromptTokensDetails: r.InputTokensDetails}
	return u, u.PromptTokens > 0
}

func showUsage(u auditUsage) string {
	s := fmt.Sprintf("prompt %d", u.PromptTokens)
	if d := u.PromptTokensDetails; d != nil {
		s += ", details"
		if d.CachedTokens != nil {
			s += fmt.Sprintf(", cached %d", *d.CachedTokens)
		}
	}
	return s
}

// BenchmarkUsageShare: the audit's read of a response's usage, by the scan and by the
// encoding/json reference, side by side.
func BenchmarkUsageShare(b *testing.B) {
	body := []byte(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":250,"completion_tokens":8,"total_tokens":258,"prompt_tokens_details":{"cached_tokens":192}}}`)
	for _, c := range []struct {
		name string
		fn   func([]byte) (auditUsage, bool)
	}{{"jsonscan", usageIn}, {"encoding-json", usageInJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := c.fn(body); !ok {
					b.Fatal("no usage")
				}
			}
		})
	}
}

// FuzzLastIndexUsage checks the forward search against bytes.LastIndex.
func FuzzLastIndexUsage(f *testing.F) {
	for _, s := range []string{``, `"usage"`, `"usage""usage"`, `{"usage":{},"x":"usage","usage":1}`, `"usag"usage"`, `""usage"usage""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := lastIndexUsage(b), bytes.LastIndex(b, []byte(`"usage"`)); got != want {
			t.Fatalf("lastIndexUsage(%q) = %d, want %d", b, got, want)
		}
	})
}

// BenchmarkLastIndexUsage: the tail an SSE response keeps for the audit (4 KiB of chunk events,
// no usage in them), searched for the usage key the old way and the new.
//
//	go test -run XXX -bench LastIndexUsage ./internal/gateway/
func BenchmarkLastIndexUsage(b *testing.B) {
	event := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token"},"finish_reason":null}]}` + "\n\n"
	tail := []byte(strings.Repeat(event, auditTailMax/len(event)))
	for _, c := range []struct {
		name string
		fn   func([]byte) int
	}{{"LastIndex", func(b []byte) int { return bytes.LastIndex(b, []byte(`"usage"`)) }}, {"forward", lastIndexUsage}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if c.fn(tail) >= 0 {
					b.Fatal("found a usage key that is not there")
				}
			}
		})
	}
}

// TestPolicyHearsReportedCache: the gateway hands the policy (cache_aware_hash, a
// policy.CacheObserver) the share it predicted and the share the worker reported. A prompt the
// worker already holds from a request that did not pass this gateway is predicted uncached and
// reported cached: the policy's unpredicted share rises by one answer's weight.
func TestPolicyHearsReportedCache(t *testing.T) {
	g, ws := newAuditGateway(t, Config{}, "cache_aware_hash", policy.DefaultConfig(), 1)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("sent by another gateway ", 20) + `"}]}`
	resp, err := http.Post(ws[0].URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp = g.post(t, "/v1/chat/completions", body)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	g.waitDone(t, 1)
	pol, err := g.router.For("m", worker.Regular)
	if err != nil {
		t.Fatal(err)
	}
	cah, ok := pol.(*policy.Cost)
	if !ok {
		t.Fatalf("policy %T", pol)
	}
	if u := cah.Unpredicted(); u < 0.9 { // the first answer counts at once
		t.Fatalf("unpredicted share %v after one fully cached answer predicted uncached", u)
	}
}
