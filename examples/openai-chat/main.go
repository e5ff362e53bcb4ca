// Command openai-chat asks kvgate a question with the official OpenAI Go SDK, streaming the
// answer. Start the gateway first (go run ./cmd/kvgate), then: go run ./examples/openai-chat
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func main() {
	base := flag.String("base-url", "http://localhost:30000/v1/", "the gateway's OpenAI base URL")
	model := flag.String("model", "kvgate-sim", "model to ask")
	flag.Parse()
	client := openai.NewClient(option.WithBaseURL(*base), option.WithAPIKey("unused-without---api-key"))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: *model,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a helpful assistant."),
			openai.UserMessage("What does a KV cache do?"),
		},
		MaxTokens:     openai.Int(16),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	for stream.Next() {
		chunk := stream.Current()
		if len(chunk.Choices) > 0 {
			fmt.Print(chunk.Choices[0].Delta.Content)
		}
		if chunk.Usage.TotalTokens > 0 {
			fmt.Printf("\n[usage: %d prompt tokens (%d cached), %d completion tokens]\n",
				chunk.Usage.PromptTokens, chunk.Usage.PromptTokensDetails.CachedTokens, chunk.Usage.CompletionTokens)
		}
	}
	if err := stream.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
