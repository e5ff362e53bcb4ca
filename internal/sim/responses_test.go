package sim

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/kvgate/kvgate/internal/testutil"
)

func responseParams(input string, max int64) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model:           DefaultModel,
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
		Instructions:    openai.String("You answer briefly. "),
		MaxOutputTokens: openai.Int(max),
	}
}

// The official SDK's client.Responses.New works against the simulator, and a follow-up turn
// (previous_response_id) continues the stored conversation: its prompt starts with the first
// turn's, which the engine's prefix cache holds. A server that never gave the id answers 404.
func TestResponsesSDK(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	client := sdk(ts)
	ctx := testCtx(t)
	first, err := client.Responses.New(ctx, responseParams(strings.Repeat("tell me about the sea ", 40), 6))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.ID, "resp_") || first.Status != responses.ResponseStatusCompleted || first.OutputText() == "" {
		t.Fatalf("first turn: id %q status %q text %q", first.ID, first.Status, first.OutputText())
	}
	if first.Usage.OutputTokens != 6 || first.Usage.InputTokens < 200 {
		t.Fatalf("first turn usage %+v", first.Usage)
	}
	p := responseParams("and the mountains?", 4)
	p.PreviousResponseID = openai.String(first.ID)
	second, err := client.Responses.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if second.Usage.InputTokens <= first.Usage.InputTokens+first.Usage.OutputTokens {
		t.Errorf("follow-up prompt of %d tokens does not hold the first turn (%d in, %d out)",
			second.Usage.InputTokens, first.Usage.InputTokens, first.Usage.OutputTokens)
	}
	if second.Usage.InputTokensDetails.CachedTokens < first.Usage.InputTokens/2 {
		t.Errorf("follow-up cached %d tokens; the first turn's %d prompt tokens should hit", second.Usage.InputTokensDetails.CachedTokens, first.Usage.InputTokens)
	}
	if second.PreviousResponseID != first.ID {
		t.Errorf("previous_response_id %q, want %q", second.PreviousResponseID, first.ID)
	}

	_, other := startServer(t, fastConfig())
	otherClient := sdk(other)
	_, err = otherClient.Responses.New(ctx, p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("a follow-up on a server that never gave the id: %v, want 404", err)
	}
}

// Streaming through the SDK: the Responses event sequence, deltas that add up to the completed
// response's text, and usage in response.completed.
func TestResponsesSDKStreaming(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	client := sdk(ts)
	rs := testutil.ReadResponseStream(t, client.Responses.NewStreaming(testCtx(t), responseParams("hello there", 5)))
	types, done := rs.Types, rs.Done
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if len(types) < len(want)+5 || strings.Join(types[:len(want)], ",") != strings.Join(want, ",") {
		t.Fatalf("event types %v", types)
	}
	if tail := types[len(types)-4:]; strings.Join(tail, ",") != "response.output_text.done,response.content_part.done,response.output_item.done,response.completed" {
		t.Fatalf("closing events %v", tail)
	}
	if done.ID == "" || done.OutputText() != rs.Text || done.Usage.OutputTokens != 5 {
		t.Fatalf("completed %q (%d tokens) against deltas %q", done.OutputText(), done.Usage.OutputTokens, rs.Text)
	}
}
