package testutil

import (
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
)

// ResponseStream is what an OpenAI Responses stream delivered: its event types in order, the
// text its output_text deltas add up to, and the response of its response.completed event (zero
// when none came).
type ResponseStream struct {
	Types []string
	Text  string
	Done  responses.Response
}

// ReadResponseStream reads stream to its end, failing t on a stream error.
func ReadResponseStream(t testing.TB, stream *ssestream.Stream[responses.ResponseStreamEventUnion]) ResponseStream {
	t.Helper()
	var rs ResponseStream
	var text strings.Builder
	for stream.Next() {
		ev := stream.Current()
		rs.Types = append(rs.Types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			rs.Done = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	rs.Text = text.String()
	return rs
}
