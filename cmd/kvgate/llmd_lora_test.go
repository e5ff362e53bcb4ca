package main

import (
	"strings"
	"testing"
)

// llm-d-inference-sim's events for an adapter's prompt, in both encodings: the gateway predicts
// the adapter's request for the prompt from them, and credits the base model's request for the
// same prompt with none of the adapter's blocks.
func TestLLMDKVEventsPerAdapter(t *testing.T) {
	for _, enc := range []string{"array", "map"} {
		t.Run(enc, func(t *testing.T) {
			g := startLLMDEventGateway(t, "base", llmdEventArgs(enc, "--max-loras", "2", "--lora-modules", `{"name":"sql","path":"/adapters/sql"}`)...)
			prompt := strings.Repeat("an adapter's prompt on an engine we did not write ", 12)
			g.serveDirect(t, "sql", prompt)
			g.waitPredicted(t, "sql", prompt)
			if route, hit := g.route(t, "base", prompt); hit != 0 {
				t.Fatalf("the base model's request was credited with the adapter's blocks: route %q, predicted %v", route, hit)
			}
		})
	}
}
