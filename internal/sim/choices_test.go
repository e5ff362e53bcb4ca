package sim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestChoicesN: n > 1 answers n choices, each its own sequence, whole and streamed, with the
// prompt counted once in the usage.
func TestChoicesN(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	c := sdk(ts)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     DefaultModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me three things")},
		N:         openai.Int(3),
		MaxTokens: openai.Int(5),
	}
	chat, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 3 {
		t.Fatalf("%d choices, want 3", len(chat.Choices))
	}
	seen := map[string]bool{}
	for i, ch := range chat.Choices {
		if ch.Index != int64(i) || ch.Message.Content == "" {
			t.Errorf("choice %d: index %d content %q", i, ch.Index, ch.Message.Content)
		}
		seen[ch.Message.Content] = true
	}
	if len(seen) < 2 {
		t.Error("the choices are all the same text")
	}
	if u := chat.Usage; u.CompletionTokens != 15 || u.TotalTokens != u.PromptTokens+15 {
		t.Errorf("usage %+v: want 3×5 completion tokens and the prompt once", u)
	}

	params.N = openai.Int(2)
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	texts := map[int64]string{}
	finished := map[int64]bool{}
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			texts[ch.Index] += ch.Delta.Content
			if ch.FinishReason != "" {
				finished[ch.Index] = true
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(texts) != 2 || !finished[0] || !finished[1] || texts[0] == "" || texts[1] == "" {
		t.Errorf("streamed choices %v finished %v; want two, each finished", texts, finished)
	}

	res := post(t, ts.URL+"/v1/completions", `{"prompt":"x","n":0}`)
	if res.StatusCode != 400 {
		t.Errorf("n=0: status %d, want 400", res.StatusCode)
	}
}

// TestEmbeddings: /v1/embeddings answers one unit vector per input, equal inputs alike, through
// the official client, and base64 when asked.
func TestEmbeddings(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	c := sdk(ts)
	res, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model:          DefaultModel,
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"alpha", "beta", "alpha"}},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 3 || res.Usage.PromptTokens == 0 {
		t.Fatalf("%d embeddings, usage %+v", len(res.Data), res.Usage)
	}
	var norm float64
	for _, f := range res.Data[0].Embedding {
		norm += f * f
	}
	if len(res.Data[0].Embedding) != embeddingDims || norm < 0.99 || norm > 1.01 {
		t.Errorf("embedding of %d dims, squared norm %v; want %d dims, a unit vector", len(res.Data[0].Embedding), norm, embeddingDims)
	}
	if res.Data[0].Embedding[0] != res.Data[2].Embedding[0] || res.Data[0].Embedding[0] == res.Data[1].Embedding[0] {
		t.Error("equal inputs must embed alike and different ones differently")
	}

	raw := post(t, ts.URL+"/v1/embeddings", `{"input":"alpha","encoding_format":"base64"}`)
	body, _ := io.ReadAll(raw.Body)
	var b struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(b.Data) != 1 {
		t.Fatalf("base64 answer %s: %v", body, err)
	}
	if dec, err := base64.StdEncoding.DecodeString(b.Data[0].Embedding); err != nil || len(dec) != 4*embeddingDims {
		t.Errorf("base64 embedding of %d bytes (%v), want %d", len(dec), err, 4*embeddingDims)
	}
	if bad := post(t, ts.URL+"/v1/embeddings", `{"input":[]}`); bad.StatusCode != 400 {
		t.Errorf("empty input: status %d, want 400", bad.StatusCode)
	}
}
