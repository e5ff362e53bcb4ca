package gateway

import (
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestLearnsFromLLMDSimStreams: in front of llm-d-inference-sim (skipped where it is absent),
// a streamed chat whose client did not ask for usage is asked for it, the client sees no usage
// chunk, and the engine's cached tokens reach the prediction audit for every answer.
func TestLearnsFromLLMDSimStreams(t *testing.T) {
	eng := testutil.StartLLMDSim(t, "m", "--zmq-endpoint", "", "--enable-kvcache", "--kv-cache-size", "2048",
		"--block-size", "16", "--max-num-seqs", "8", "--max-model-len", "16384", "--mode", "random", "--seed", "7")
	g, _ := newAuditGateway(t, Config{}, "cache_aware_hash", policy.DefaultConfig(), 0)
	g.mustRegister(t, AddWorkerRequest{URL: eng.URL})
	c := openai.NewClient(option.WithBaseURL(g.srv.URL+"/v1/"), option.WithAPIKey(g.bearer), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{
		Model:     "m",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("a question the engine will cache ", 40))},
		MaxTokens: openai.Int(4),
	}
	for range 2 {
		streamWithoutUsage(t, c, params, eng.Output())
		g.waitDone(t, 1)
	}
	count, _, unverified := predictionHistogram(t, g.Server)
	if count != 2 || unverified != 0 {
		t.Fatalf("%d predictions compared, %v unverified: want both answers' cached tokens read", count, unverified)
	}
}
