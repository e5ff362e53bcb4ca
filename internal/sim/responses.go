package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The Responses API (POST /v1/responses), as vLLM and SGLang serve it: "input" (a string, or an
// array of message items whose content is a string or input_text/output_text parts),
// "instructions", "max_output_tokens", "stream", and "previous_response_id", which continues a
// conversation this server answered. The server keeps each response it gave (bounded:
// maxConversations, maxConversationBytes; the oldest go first), as vLLM keeps stored responses in
// memory, so that a follow-up's prompt is the conversation so far plus its new input — which is
// what the engine's prefix cache then holds — and a follow-up sent to a server that never saw the
// previous response is answered 404, as vLLM answers it. Streaming sends the Responses event
// sequence (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta…, response.output_text.done,
// response.content_part.done, response.output_item.done, response.completed), each as
// "event: TYPE" and "data: JSON", with no [DONE].

const (
	// maxConversations and maxConversationBytes bound the stored responses.
	maxConversations     = 4096
	maxConversationBytes = 64 << 20
)

// responsesTurn is what a Responses request carries beyond the common request.
type responsesTurn struct {
	id           string // this response's id
	previous     string // previous_response_id, "" when none
	instructions *string
	// history is the conversation before this turn's input: the stored text of the previous
	// response; input is this turn's input text.
	history, input string

	// store keeps the conversation through this response, and the response object (GET
	// /v1/responses/{id}) with its input; nil with "store": false.
	store   func(id, text string, stored storedResponse)
	seq     int    // the next event's sequence_number
	opened  bool   // the stream's opening events were sent
	itemID  string // the output message's id
	created int64
}

type responsesBody struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	CacheSalt          string          `json:"cache_salt"`
}

// conversations are the responses this server gave: id → the conversation's text through that
// response. The zero value is ready to use.
type conversations struct {
	mu   sync.Mutex
	tag  string // this server's part of every response id, so servers never share one
	next uint64
	text map[string]string
	// stored is the response object each id names, for GET and DELETE /v1/responses/{id}.
	stored map[string]storedResponse
	order  []string // oldest first
	bytes  int
}

// newID returns a suffix for a response's ids ("resp_" and "msg_" prefix it), unique to this
// server: servers do not share one, so a follow-up sent to the wrong one is not found.
func (c *conversations) newID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tag == "" {
		c.tag = fmt.Sprintf("%08x", rand.Uint32())
	}
	c.next++
	return fmt.Sprintf("%s%016x", c.tag, c.next)
}

func (c *conversations) get(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.text[id]
	return t, ok
}

// put stores a conversation and its last response, dropping the oldest past the bounds.
func (c *conversations) put(id, text string, stored storedResponse) {
	if len(text) > maxConversationBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.text == nil {
		c.text, c.stored = map[string]string{}, map[string]storedResponse{}
	}
	c.text[id], c.stored[id] = text, stored
	c.order = append(c.order, id)
	c.bytes += len(text)
	for len(c.order) > maxConversations || c.bytes > maxConversationBytes {
		old := c.order[0]
		c.order = c.order[1:]
		if t, ok := c.text[old]; ok { // a deleted one was counted off already
			c.bytes -= len(t)
		}
		delete(c.text, old)
		delete(c.stored, old)
	}
}

// handleResponses serves POST /v1/responses.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	req, err := s.parseResponses(body)
	if err != nil {
		status, code, param := http.StatusBadRequest, "", ""
		if e, ok := err.(*notFound); ok {
			status, code, param = http.StatusNotFound, "previous_response_not_found", "previous_response_id"
			err = e.err
		}
		writeError(w, status, "invalid_request_error", code, param, "%v", err)
		return
	}
	if req.model != "" && req.model != s.cfg.Model {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"The model `%s` does not exist.", req.model)
		return
	}
	s.serveInference(w, r, responsesAPI, req)
}

// notFound is a previous_response_id this server does not hold.
type notFound struct{ err error }

func (e *notFound) Error() string { return e.err.Error() }

// parseResponses decodes a Responses body into a request whose prompt is the instructions, the
// conversation so far and the new input.
func (s *Server) parseResponses(body []byte) (request, error) {
	var b responsesBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		return request{}, badRequest("malformed JSON body: %v", err)
	}
	input, err := responsesInput(b.Input)
	if err != nil {
		return request{}, err
	}
	suffix := s.convs.newID()
	t := &responsesTurn{id: "resp_" + suffix, itemID: "msg_" + suffix, instructions: b.Instructions, input: input,
		created: time.Now().Unix(), store: s.convs.put}
	if b.Store != nil && !*b.Store {
		t.store = nil
	}
	if b.PreviousResponseID != nil && *b.PreviousResponseID != "" {
		t.previous = *b.PreviousResponseID
		h, ok := s.convs.get(t.previous)
		if !ok {
			return request{}, &notFound{fmt.Errorf("Response with id '%s' not found.", t.previous)}
		}
		t.history = h
	}
	maxTokens, err := pickMax(nil, "max_output_tokens", b.MaxOutputTokens, "", nil)
	if err != nil {
		return request{}, err
	}
	var prompt strings.Builder
	if b.Instructions != nil {
		prompt.WriteString(*b.Instructions)
	}
	prompt.WriteString(t.history)
	prompt.WriteString(t.input)
	if prompt.Len() == 0 {
		return request{}, badRequest("input is empty")
	}
	return request{model: b.Model, prompt: prompt.String(), maxTokens: maxTokens, stream: b.Stream, responses: t, salt: b.CacheSalt}, nil
}

// responsesInput is the text of a Responses "input".
func responsesInput(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", badRequest("input is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var items []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", badRequest("input must be a string or an array of items")
	}
	var sb strings.Builder
	for i, it := range items {
		if err := contentText(&sb, it.Content, responsesTextPart); err != nil {
			return "", badRequest("input[%d].content: %v", i, err)
		}
	}
	return sb.String(), nil
}

// responsesTextPart reports whether a Responses content part of type typ carries text.
func responsesTextPart(typ string) bool {
	return typ == "input_text" || typ == "output_text" || typ == "text"
}

// responseUsage is the Responses API's usage object.
func responseUsage(u usage) map[string]any {
	return map[string]any{
		"input_tokens": u.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": u.CachedTokens},
		"output_tokens": u.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
		"total_tokens": u.PromptTokens + u.CompletionTokens,
	}
}

// object is the response object in a state: its output (nil: none yet) and usage (nil: none).
func (t *responsesTurn) object(model, status string, output []any, u *usage) map[string]any {
	if output == nil {
		output = []any{}
	}
	o := map[string]any{
		"id": t.id, "object": "response", "created_at": t.created, "status": status, "model": model,
		"output": output, "error": nil, "incomplete_details": nil, "instructions": t.instructions,
		"metadata": map[string]string{}, "parallel_tool_calls": true, "temperature": 1.0, "top_p": 1.0,
		"tool_choice": "auto", "tools": []any{}, "text": map[string]any{"format": map[string]string{"type": "text"}},
		"previous_response_id": nil, "usage": nil,
	}
	if t.previous != "" {
		o["previous_response_id"] = t.previous
	}
	if u != nil {
		o["usage"] = responseUsage(*u)
	}
	return o
}

// message is the output message item with text so far.
func (t *responsesTurn) message(status, text string, parts bool) map[string]any {
	content := []any{}
	if parts {
		content = append(content, outputText(text))
	}
	return map[string]any{"id": t.itemID, "type": "message", "status": status, "role": "assistant", "content": content}
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

// emit sends one Responses stream event of type typ with fields.
func (o *writer) emit(typ string, fields map[string]any) error {
	t := o.req.responses
	fields["sequence_number"] = t.seq
	t.seq++
	return o.emitNamed(typ, fields)
}

// responsesOpen sends the stream's opening events once.
func (o *writer) responsesOpen() error {
	t := o.req.responses
	if t.opened {
		return nil
	}
	t.opened = true
	for _, e := range []struct {
		typ    string
		fields map[string]any
	}{
		{"response.created", map[string]any{"response": t.object(o.model, "in_progress", nil, nil)}},
		{"response.in_progress", map[string]any{"response": t.object(o.model, "in_progress", nil, nil)}},
		{"response.output_item.added", map[string]any{"output_index": 0, "item": t.message("in_progress", "", false)}},
		{"response.content_part.added", map[string]any{"item_id": t.itemID, "output_index": 0, "content_index": 0, "part": outputText("")}},
	} {
		if err := o.emit(e.typ, e.fields); err != nil {
			return err
		}
	}
	return nil
}

// responsesTokens streams output tokens [from, to).
func (o *writer) responsesTokens(from, to int) error {
	if err := o.responsesOpen(); err != nil {
		return err
	}
	t := o.req.responses
	return o.emit("response.output_text.delta", map[string]any{"item_id": t.itemID, "output_index": 0,
		"content_index": 0, "delta": generatedText(o.ids[0], from, to), "logprobs": []any{}})
}

// responsesFinish writes the end of the answer — the closing events, or the whole response — and
// stores the conversation for a follow-up turn.
func (o *writer) responsesFinish(u usage) {
	t := o.req.responses
	text := generatedText(o.ids[0], 0, o.lengths[0])
	done := t.object(o.model, "completed", []any{t.message("completed", text, true)}, &u)
	if t.store != nil {
		t.store(t.id, t.history+t.input+text, storedResponse{object: done, input: t.input, itemID: t.itemID})
	}
	if !o.req.stream {
		writeJSON(o.w, done)
		return
	}
	if o.responsesOpen() != nil {
		return
	}
	base := map[string]any{"item_id": t.itemID, "output_index": 0, "content_index": 0}
	with := func(k string, v any) map[string]any {
		m := map[string]any{k: v}
		for bk, bv := range base {
			m[bk] = bv
		}
		return m
	}
	done2 := with("text", text)
	done2["logprobs"] = []any{}
	_ = o.emit("response.output_text.done", done2)
	_ = o.emit("response.content_part.done", with("part", outputText(text)))
	_ = o.emit("response.output_item.done", map[string]any{"output_index": 0, "item": t.message("completed", text, true)})
	_ = o.emit("response.completed", map[string]any{"response": done})
}
