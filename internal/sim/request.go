package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// apiKind is which endpoint a request came to.
type apiKind uint8

const (
	chatAPI apiKind = iota
	completionAPI
	generateAPI
	responsesAPI
	messagesAPI
)

// request is what the simulator needs from an inference request body.
type request struct {
	model string
	// prompt is the prompt text: chat → the message contents in order (string contents and the
	// text parts of array contents), concatenated; completions → prompt (or its first element);
	// generate → text. It is the gateway's routing text, so both count tokens alike.
	prompt string
	// tokens is the prompt as token ids (completions with a token-array prompt, generate with
	// input_ids); nil when the prompt is text.
	tokens []uint32
	// maxTokens is the requested output length; 0 when the body names none.
	maxTokens    int
	stream       bool
	includeUsage bool
	// n is the number of choices asked for (chat and completions); 0 means 1.
	n int
	// adapter is the LoRA adapter the model names ("" the base model; lora.go).
	adapter string
	// kv is the request's kv_transfer_params (pd.go); nil when it has none.
	kv *kvTransfer
	// responses is a Responses API turn's own state (responses.go); nil for the other routes.
	responses *responsesTurn
	// salt is the body's cache_salt ("" for none): the engine keys the prompt's blocks by it.
	salt string
	// messages is a Messages API request's own state (messages.go); nil for the other routes.
	messages *messagesTurn
}

// maxChoices bounds n, as OpenAI's API does (128).
const maxChoices = 128

// errBadRequest marks errors that are the client's fault.
var errBadRequest = errors.New("bad request")

func badRequest(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, a...))
}

type chatBody struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	N                   *int            `json:"n"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransfer          *kvTransfer     `json:"kv_transfer_params"`
	Prompt              json.RawMessage `json:"prompt"`
	Text                *string         `json:"text"`
	InputIDs            []int64         `json:"input_ids"`
	CacheSalt           *string         `json:"cache_salt"`
	SamplingParams      *struct {
		MaxNewTokens *int `json:"max_new_tokens"`
	} `json:"sampling_params"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parseRequest decodes an inference request body for endpoint kind. Errors wrap errBadRequest.
func parseRequest(kind apiKind, body []byte) (request, error) {
	var b chatBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		return request{}, badRequest("malformed JSON body: %v", err)
	}
	if dec.More() {
		return request{}, badRequest("malformed JSON body: trailing data")
	}
	r := request{model: b.Model, stream: b.Stream, kv: b.KVTransfer}
	if b.CacheSalt != nil {
		r.salt = *b.CacheSalt
	}
	if b.StreamOptions != nil {
		r.includeUsage = b.StreamOptions.IncludeUsage
	}
	var err error
	switch kind {
	case chatAPI:
		if len(b.Messages) == 0 {
			return request{}, badRequest("messages must be a non-empty array")
		}
		r.prompt, err = chatText(b.Messages)
		r.maxTokens, err = pickMax(err, "max_completion_tokens", b.MaxCompletionTokens, "max_tokens", b.MaxTokens)
	case completionAPI:
		r.prompt, r.tokens, err = completionPrompt(b.Prompt)
		r.maxTokens, err = pickMax(err, "max_tokens", b.MaxTokens, "", nil)
	case generateAPI:
		switch {
		case b.Text != nil:
			r.prompt = *b.Text
		case b.InputIDs != nil:
			r.tokens, err = tokenIDs(b.InputIDs)
		default:
			err = badRequest("text or input_ids is required")
		}
		var max *int
		if b.SamplingParams != nil {
			max = b.SamplingParams.MaxNewTokens
		}
		r.maxTokens, err = pickMax(err, "sampling_params.max_new_tokens", max, "", nil)
	}
	if err == nil && b.N != nil && kind != generateAPI {
		if *b.N < 1 || *b.N > maxChoices {
			err = badRequest("n must be between 1 and %d", maxChoices)
		}
		r.n = *b.N
	}
	if err != nil {
		return request{}, err
	}
	if r.prompt == "" && len(r.tokens) == 0 {
		return request{}, badRequest("the prompt is empty")
	}
	return r, nil
}

// pickMax returns the first non-nil of a and b, checking it is not negative; err passes through.
func pickMax(err error, an string, a *int, bn string, b *int) (int, error) {
	if err != nil {
		return 0, err
	}
	v, name := a, an
	if v == nil {
		v, name = b, bn
	}
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, badRequest("%s must be at least 1, got %d", name, *v)
	}
	return *v, nil
}

// chatText concatenates the message contents.
func chatText(msgs []chatMessage) (string, error) {
	var sb strings.Builder
	for i, m := range msgs {
		if err := contentText(&sb, m.Content, func(typ string) bool { return typ == "text" }); err != nil {
			return "", badRequest("messages[%d].content: %v", i, err)
		}
	}
	return sb.String(), nil
}

// contentText appends a message content's text to sb: a string, or the text of the parts of an
// array whose type textPart accepts; null adds nothing.
func contentText(sb *strings.Builder, raw json.RawMessage, textPart func(typ string) bool) error {
	c := bytes.TrimSpace(raw)
	switch {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
	case c[0] == '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return err
		}
		sb.WriteString(s)
	case c[0] == '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return err
		}
		for _, p := range parts {
			if textPart(p.Type) {
				sb.WriteString(p.Text)
			}
		}
	default:
		return errors.New("must be a string or an array of parts")
	}
	return nil
}

// completionPrompt decodes a completions prompt: a string, an array of strings (the first is
// served), an array of token ids, or an array of those (the first is served).
func completionPrompt(raw json.RawMessage) (string, []uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil, badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		return ss[0], nil, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		t, err := tokenIDs(ids)
		return "", t, err
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil && len(idss) > 0 {
		t, err := tokenIDs(idss[0])
		return "", t, err
	}
	return "", nil, badRequest("prompt must be a string, an array of strings or an array of token ids")
}

// tokenIDs converts token ids to the engine's tokens.
func tokenIDs(ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<32-1 {
			return nil, badRequest("token id %d out of range", id)
		}
		out[i] = uint32(id)
	}
	return out, nil
}
