package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/engine"
)

// Anthropic's Messages API, as vLLM serves it: POST /v1/messages with "model", "max_tokens"
// (required), "system" (a string or text blocks), "messages" (string contents or content
// blocks: the text of text blocks is the prompt; images, tool use and tool results add none),
// "stream" and "cache_salt"; and POST /v1/messages/count_tokens, which answers the prompt's
// {"input_tokens"}. The prompt is the system text then the messages' text, the gateway's
// routing text. A streamed answer is the Messages event sequence, each as "event: TYPE" and
// "data: JSON": message_start, content_block_start, content_block_delta per batch of tokens,
// content_block_stop, message_delta (the stop reason and output usage), message_stop. Errors
// are in Anthropic's shape, {"type":"error","error":{"type","message"}}.

// messagesTurn is what a Messages request carries beyond the common request.
type messagesTurn struct {
	id     string
	opened bool // message_start and content_block_start were sent
	input  int  // the prompt's tokens, for message_start's usage
}

type messagesBody struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []chatMessage   `json:"messages"`
	Stream    bool            `json:"stream"`
	CacheSalt string          `json:"cache_salt"`
}

func (s *Server) messagesRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /v1/messages", s.handleMessages)
	m.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
}

// parseMessages decodes a Messages body; count is true for count_tokens, which needs no
// max_tokens.
func parseMessages(body []byte, count bool) (request, error) {
	var b messagesBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		return request{}, badRequest("malformed JSON body: %v", err)
	}
	if len(b.Messages) == 0 {
		return request{}, badRequest("messages: at least one message is required")
	}
	var sb strings.Builder
	if err := contentText(&sb, b.System, func(typ string) bool { return typ == "text" }); err != nil {
		return request{}, badRequest("system: %v", err)
	}
	text, err := chatText(b.Messages)
	if err != nil {
		return request{}, err
	}
	sb.WriteString(text)
	r := request{model: b.Model, prompt: sb.String(), stream: b.Stream, salt: b.CacheSalt}
	if !count {
		if b.MaxTokens == nil {
			return request{}, badRequest("max_tokens: field required")
		}
		if r.maxTokens, err = pickMax(nil, "max_tokens", b.MaxTokens, "", nil); err != nil {
			return request{}, err
		}
	}
	if r.prompt == "" {
		return request{}, badRequest("the prompt is empty")
	}
	return r, nil
}

// messagesError writes an error in Anthropic's shape.
func messagesError(w http.ResponseWriter, status int, typ, format string, a ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error",
		"error": map[string]string{"type": typ, "message": fmt.Sprintf(format, a...)}})
}

// messagesRequest reads and checks a Messages request, or answers its error.
func (s *Server) messagesRequest(w http.ResponseWriter, r *http.Request, count bool) (request, bool) {
	body, ok := readBody(w, r)
	if !ok {
		return request{}, false
	}
	req, err := parseMessages(body, count)
	if err != nil {
		messagesError(w, http.StatusBadRequest, "invalid_request_error", "%v", err)
		return request{}, false
	}
	if req.model != "" && req.model != s.cfg.Model {
		messagesError(w, http.StatusNotFound, "not_found_error", "model: %s", req.model)
		return request{}, false
	}
	return req, true
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	req, ok := s.messagesRequest(w, r, false)
	if !ok {
		return
	}
	req.messages = &messagesTurn{id: fmt.Sprintf("msg_%s", s.convs.newID()), input: engine.TokenCount(req.prompt)}
	s.serveInference(w, r, messagesAPI, req)
}

func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	if req, ok := s.messagesRequest(w, r, true); ok {
		writeJSON(w, map[string]int{"input_tokens": engine.TokenCount(req.prompt)})
	}
}

// emitNamed sends one event of a named-event stream (Messages, Responses) and flushes it.
func (o *writer) emitNamed(typ string, fields map[string]any) error {
	fields["type"] = typ
	o.begin()
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(o.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
		return err
	}
	return o.rc.Flush()
}

// message is the Messages answer object with content text (nil: none yet).
func (o *writer) message(text *string, stop any, u map[string]int) map[string]any {
	content := []any{}
	if text != nil {
		content = append(content, map[string]any{"type": "text", "text": *text})
	}
	return map[string]any{"id": o.req.messages.id, "type": "message", "role": "assistant", "model": o.model,
		"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": u}
}

// messagesOpen sends message_start and content_block_start once.
func (o *writer) messagesOpen() error {
	t := o.req.messages
	if t.opened {
		return nil
	}
	t.opened = true
	if err := o.emitNamed("message_start", map[string]any{"message": o.message(nil, nil, map[string]int{"input_tokens": t.input, "output_tokens": 0})}); err != nil {
		return err
	}
	return o.emitNamed("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
}

// messagesTokens streams output tokens [from, to).
func (o *writer) messagesTokens(from, to int) error {
	if err := o.messagesOpen(); err != nil {
		return err
	}
	return o.emitNamed("content_block_delta", map[string]any{"index": 0,
		"delta": map[string]any{"type": "text_delta", "text": generatedText(o.ids[0], from, to)}})
}

// messagesFinish writes the end of the answer: the closing events, or the whole message.
func (o *writer) messagesFinish(u usage) {
	text := generatedText(o.ids[0], 0, o.lengths[0])
	mu := map[string]int{"input_tokens": u.PromptTokens - u.CachedTokens, "output_tokens": u.CompletionTokens,
		"cache_read_input_tokens": u.CachedTokens, "cache_creation_input_tokens": 0}
	if !o.req.stream {
		writeJSON(o.w, o.message(&text, "max_tokens", mu))
		return
	}
	if o.messagesOpen() != nil {
		return
	}
	_ = o.emitNamed("content_block_stop", map[string]any{"index": 0})
	_ = o.emitNamed("message_delta", map[string]any{"delta": map[string]any{"stop_reason": "max_tokens", "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": u.CompletionTokens}})
	_ = o.emitNamed("message_stop", map[string]any{})
}
