package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
)

// streamWithoutUsage streams params through c with the official SDK and fails t if any chunk
// has no choices[0] or carries usage (the client did not ask for it), or if the stream failed or
// was empty; engine is what to show when it did.
func streamWithoutUsage(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams, engine string) {
	t.Helper()
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	chunks := 0
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if len(ch.Choices) == 0 || ch.Usage.PromptTokens != 0 {
			t.Errorf("chunk %d: %d choices, usage %+v: the client did not ask for usage", chunks, len(ch.Choices), ch.Usage)
		}
	}
	if err := stream.Err(); err != nil || chunks == 0 {
		t.Fatalf("SDK stream: %d chunks, err %v\n%s", chunks, err, engine)
	}
}

// calibrated returns kvgate_prefix_prediction_bias's series: worker → value.
func calibrated(t *testing.T, s *Server) map[string]float64 {
	return workerGauge(t, s, "kvgate_prefix_prediction_bias")
}

// workerGauge returns the series of the gauge name: worker → value.
func workerGauge(t *testing.T, s *Server, name string) map[string]float64 {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestStreamsAreAskedForUsageTheClientDoesNotSee: a streamed request whose client did not ask
// for usage is asked for it upstream; the official SDK and a plain reader of choices[0] see
// no usage chunk, the answer's cached tokens reach the policy (the prediction is observed and
// the worker calibrated), and a client that asked for usage gets it.
func TestStreamsAreAskedForUsageTheClientDoesNotSee(t *testing.T) {
	g, _ := simGateway(t, "cache_aware_hash", 2)
	c := openai.NewClient(option.WithBaseURL(g.srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	question := strings.Repeat("a long shared question about prefix caches ", 40)
	params := openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)},
	}
	streamWithoutUsage(t, c, params, "")
	g.waitDone(t, 1)

	// A plain reader: every data line but [DONE] has a choices[0].
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + question + `"}]}`
	resp := g.post(t, "/v1/chat/completions", body)
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		events++
		var ch struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil || len(ch.Choices) == 0 {
			t.Errorf("event %q has no choices[0]", data)
		}
	}
	resp.Body.Close()
	g.waitDone(t, 1)
	if events == 0 {
		t.Fatal("no events")
	}
	count, _, unverified := predictionHistogram(t, g.Server)
	if count != 2 || unverified != 0 {
		t.Fatalf("%d predictions compared, %v unverified: want both streams' usage read", count, unverified)
	}
	if cal := calibrated(t, g.Server); len(cal) == 0 {
		t.Fatal("no worker calibrated from the answers")
	}

	// A client that asks for usage gets its usage chunk.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	var usage openai.CompletionUsage
	for stream.Next() {
		if ch := stream.Current(); ch.Usage.PromptTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil || usage.PromptTokens == 0 || usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("asked for usage: %+v, err %v; want the repeated prompt's cached tokens", usage, err)
	}
	g.waitDone(t, 1)
}

// TestGenerateAnswersAreLearned: SGLang's /generate reports cached tokens in meta_info; the
// gateway compares them with the prediction as it does an OpenAI usage.
func TestGenerateAnswersAreLearned(t *testing.T) {
	g, _ := simGateway(t, "cache_aware_hash", 2)
	body := `{"text":"` + strings.Repeat("generate from this opening ", 30) + `","sampling_params":{"max_new_tokens":4}}`
	for range 2 {
		resp := g.post(t, "/generate", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		g.waitDone(t, 1)
	}
	if count, _, unverified := predictionHistogram(t, g.Server); count != 2 || unverified != 0 {
		t.Fatalf("%d compared, %v unverified: want both /generate answers read", count, unverified)
	}
}

// TestSilentWorkersAreNamedOnce: a worker whose answers carry no cached_tokens is named in the
// log once, however many answers it gives.
func TestSilentWorkersAreNamedOnce(t *testing.T) {
	var logs testutil.SyncBuffer
	pc := policy.DefaultConfig()
	g, ws := newAuditGateway(t, Config{}, "cache_aware_hash", pc, 1)
	g.log = slog.New(slog.NewTextHandler(&logs, nil))
	ws[0].setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":4}}`)
	})
	for range 3 {
		resp := g.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"content":"hello there"}]}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		g.waitDone(t, 1)
	}
	if n := strings.Count(logs.String(), "report no cached tokens"); n != 1 {
		t.Fatalf("named %d times, want once:\n%s", n, logs.String())
	}
}
