package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CachedTokens     int `json:"-"`
	Details          struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u usage) filled() usage {
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.Details.CachedTokens = u.CachedTokens
	return u
}

// writer writes one request's answer in its endpoint's format: whole, or as Server-Sent Events
// flushed per event.
type writer struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	kind    apiKind
	model   string
	id      uint64   // the answer's id: its first choice's engine sequence
	ids     []uint64 // each choice's engine sequence, whose id seeds its text
	lengths []int    // each choice's output tokens once it ended
	req     request
	created int64
	started bool
	text    []byte // generate streams cumulative text
	// extra are members added to a whole answer (a prefill's kv_transfer_params, pd.go).
	extra map[string]any
}

func newWriter(w http.ResponseWriter, kind apiKind, model string, ids []uint64, req request) *writer {
	return &writer{w: w, rc: http.NewResponseController(w), kind: kind, model: model, id: ids[0], ids: ids,
		lengths: make([]int, len(ids)), req: req, created: time.Now().Unix()}
}

func (o *writer) objectID() string {
	switch o.kind {
	case chatAPI:
		return fmt.Sprintf("chatcmpl-%d", o.id)
	case completionAPI:
		return fmt.Sprintf("cmpl-%d", o.id)
	}
	return fmt.Sprint(o.id)
}

// begin writes the SSE headers once.
func (o *writer) begin() {
	if o.started {
		return
	}
	o.started = true
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
}

// event writes one SSE event and flushes it.
func (o *writer) event(v any) error {
	o.begin()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(o.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return o.rc.Flush()
}

type choiceDelta struct {
	Index        int               `json:"index"`
	Delta        map[string]string `json:"delta,omitempty"`
	Text         *string           `json:"text,omitempty"`
	Logprobs     any               `json:"logprobs"`
	FinishReason *string           `json:"finish_reason"`
}

type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []choiceDelta `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
}

func (o *writer) chunk(c choiceDelta) chunk {
	obj := "chat.completion.chunk"
	if o.kind == completionAPI {
		obj = "text_completion"
	}
	return chunk{ID: o.objectID(), Object: obj, Created: o.created, Model: o.model, Choices: []choiceDelta{c}}
}

// tokens streams output tokens [from, to) of choice i.
func (o *writer) tokens(i, from, to int) error {
	switch o.kind {
	case responsesAPI:
		return o.responsesTokens(from, to)
	case messagesAPI:
		return o.messagesTokens(from, to)
	}
	text := generatedText(o.ids[i], from, to)
	switch o.kind {
	case chatAPI:
		d := map[string]string{"content": text}
		if from == 0 {
			d["role"] = "assistant"
		}
		return o.event(o.chunk(choiceDelta{Index: i, Delta: d}))
	case completionAPI:
		return o.event(o.chunk(choiceDelta{Index: i, Text: &text}))
	}
	o.text = append(o.text, text...)
	return o.event(o.generateBody(string(o.text), to, usage{}, false))
}

// generateBody is SGLang's /generate answer (streamed chunks carry the text so far).
func (o *writer) generateBody(text string, completion int, u usage, done bool) map[string]any {
	meta := map[string]any{"id": o.objectID(), "completion_tokens": completion, "finish_reason": nil}
	if done {
		meta["prompt_tokens"] = u.PromptTokens
		meta["cached_tokens"] = u.CachedTokens
		meta["finish_reason"] = map[string]any{"type": "length", "length": completion}
	}
	return map[string]any{"text": text, "meta_info": meta, "index": 0}
}

// ended records that choice i finished with completion output tokens and, when streaming, sends
// its final chunk (generate's final body comes with finish).
func (o *writer) ended(i, completion int) {
	o.lengths[i] = completion
	if !o.req.stream || o.kind == responsesAPI || o.kind == messagesAPI {
		return
	}
	length := "length"
	switch o.kind {
	case chatAPI:
		_ = o.event(o.chunk(choiceDelta{Index: i, Delta: map[string]string{}, FinishReason: &length}))
	case completionAPI:
		empty := ""
		_ = o.event(o.chunk(choiceDelta{Index: i, Text: &empty, FinishReason: &length}))
	}
}

// withExtra adds o.extra's members (a prefill's kv_transfer_params, pd.go) to a whole answer.
func (o *writer) withExtra(body map[string]any) map[string]any {
	for k, v := range o.extra {
		body[k] = v
	}
	return body
}

// finish writes the end of the answer: the usage chunk and [DONE] when streaming, the whole body
// with every choice otherwise.
func (o *writer) finish(u usage) {
	u = u.filled()
	switch o.kind {
	case responsesAPI:
		o.responsesFinish(u)
		return
	case messagesAPI:
		o.messagesFinish(u)
		return
	}
	length := "length"
	if o.req.stream {
		if o.kind == generateAPI {
			_ = o.event(o.generateBody(string(o.text), u.CompletionTokens, u, true))
		}
		if o.kind != generateAPI && o.req.includeUsage {
			c := o.chunk(choiceDelta{})
			c.Choices, c.Usage = []choiceDelta{}, &u
			_ = o.event(c)
		}
		o.begin()
		_, _ = fmt.Fprint(o.w, "data: [DONE]\n\n")
		_ = o.rc.Flush()
		return
	}
	choices := make([]map[string]any, len(o.ids))
	for i, id := range o.ids {
		text := generatedText(id, 0, o.lengths[i])
		switch o.kind {
		case chatAPI:
			choices[i] = map[string]any{"index": i, "finish_reason": length, "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": text}}
		default:
			choices[i] = map[string]any{"index": i, "text": text, "finish_reason": length, "logprobs": nil}
		}
	}
	switch o.kind {
	case chatAPI:
		writeJSON(o.w, o.withExtra(map[string]any{
			"id": o.objectID(), "object": "chat.completion", "created": o.created, "model": o.model,
			"choices": choices, "usage": u,
		}))
	case completionAPI:
		writeJSON(o.w, o.withExtra(map[string]any{
			"id": o.objectID(), "object": "text_completion", "created": o.created, "model": o.model,
			"choices": choices, "usage": u,
		}))
	default:
		writeJSON(o.w, o.generateBody(generatedText(o.id, 0, u.CompletionTokens), u.CompletionTokens, u, true))
	}
}
