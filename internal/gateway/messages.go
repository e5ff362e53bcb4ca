package gateway

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// Anthropic's Messages API, POST /v1/messages and POST /v1/messages/count_tokens, as vLLM serves
// it. A request is routed like a chat completion: its routing text is the body's "system" (a
// string, or text blocks), which the engine's template puts first, then the text of its
// "messages" (string contents, and the "text" of text blocks; images, tool use and tool results
// add none), read in the same single bounded pass as every other body (parseBody). The body is
// forwarded unchanged (tools, images by URL, every field the gateway does not read), and so is
// the worker's answer: a stream's named events (message_start, content_block_start,
// content_block_delta, …, message_stop) are relayed as they come.
//
// What is Anthropic's own is the client's side of errors and keys. Every error the gateway
// answers on these routes — its own (no worker, a bad body, a refusal), a worker's 5xx it
// replaces, a worker's error in the OpenAI shape or in plain text — reaches the client in Anthropic's shape,
// {"type":"error","error":{"type","message"}}, with the status the gateway chose
// (anthropicErrorType names the type); an error a worker already gives in that shape passes
// unchanged. Anthropic's clients send their key as x-api-key: on these routes it counts as the
// Authorization bearer token when no Authorization is sent, and it is never forwarded to a worker
// (the gateway's keys are not the workers').

const (
	// messagesPath and countTokensPath are the Messages API's routes.
	messagesPath    = "/v1/messages"
	countTokensPath = "/v1/messages/count_tokens"
	// anthropicErrorMax bounds the error answer held to be reshaped, in bytes: the gateway's
	// and the engines' errors are a few hundred bytes; a larger one passes unchanged.
	anthropicErrorMax = 64 << 10
	// anthropicMessageMax bounds the message made of an error body that is not JSON, in bytes.
	anthropicMessageMax = 512
)

// messagesRoutes registers the Messages API's routes on mux.
func (s *Server) messagesRoutes(mux *http.ServeMux) {
	for _, path := range []string{messagesPath, countTokensPath} {
		mux.Handle("POST "+path, anthropicAPI(s.clientAuth(s.inference(path, kindMessages))))
	}
}

// messagesMember reads one top-level member of a Messages body ("system", "messages"),
// reporting false for a member it does not read (the caller skips it).
func messagesMember(s *jsonscan.Scanner, key []byte, text, system *textBuf, bad func(string)) bool {
	switch string(key) {
	case "messages":
		messages(s, text, bad)
	case "system":
		switch s.Peek() {
		case '"':
			system.add(s.Str(false))
		case '[':
			contentParts(s, system, chatTextPart)
		case 'n':
			s.Skip()
		default:
			bad(`"system" must be a string or an array of content blocks`)
		}
	default:
		return false
	}
	return true
}

// anthropicAPI adapts a handler to Anthropic's clients: x-api-key is taken as the bearer token
// (and not forwarded), and error answers are reshaped into Anthropic's error shape.
func anthropicAPI(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("X-Api-Key"); k != "" || len(r.Header.Values("X-Api-Key")) > 0 {
			r = r.Clone(r.Context())
			r.Header.Del("X-Api-Key")
			if r.Header.Get("Authorization") == "" {
				r.Header.Set("Authorization", "Bearer "+k)
			}
		}
		aw := &anthropicWriter{ResponseWriter: w}
		defer aw.finish()
		next.ServeHTTP(aw, r)
	})
}

// anthropicWriter holds an error answer (a status of 400 or more) until the handler returns, to reshape it into Anthropic's error shape; every other answer, streams
// included, passes through unchanged as it is written.
type anthropicWriter struct {
	http.ResponseWriter
	status int
	held   bool // an error answer is being held
	body   []byte
	stream bool // the answer is an event stream
}

func (a *anthropicWriter) WriteHeader(code int) {
	if a.status != 0 {
		return
	}
	if code < 200 {
		a.ResponseWriter.WriteHeader(code) // 1xx: informational, not the answer
		return
	}
	a.status = code
	if code >= 400 {
		a.held = true
		return
	}
	a.stream = strings.HasPrefix(a.Header().Get("Content-Type"), "text/event-stream")
	a.ResponseWriter.WriteHeader(code)
}

func (a *anthropicWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if !a.held {
		if a.stream {
			if out, ok := anthropicStreamError(b); ok {
				if _, err := a.ResponseWriter.Write(out); err != nil {
					return 0, err
				}
				return len(b), nil
			}
		}
		return a.ResponseWriter.Write(b)
	}
	if len(a.body)+len(b) <= anthropicErrorMax {
		a.body = append(a.body, b...)
		return len(b), nil
	}
	a.release(a.body)
	return a.ResponseWriter.Write(b)
}

// release sends the held answer's status and body as they are, and stops holding.
func (a *anthropicWriter) release(body []byte) {
	a.held = false
	a.ResponseWriter.WriteHeader(a.status)
	if len(body) > 0 {
		_, _ = a.ResponseWriter.Write(body)
	}
	a.body = nil
}

// Flush flushes what is not held.
func (a *anthropicWriter) Flush() {
	if a.held {
		return
	}
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (its Flush stops at Flush above).
func (a *anthropicWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// finish sends a held error answer, reshaped when it is in the OpenAI shape.
func (a *anthropicWriter) finish() {
	if !a.held {
		return
	}
	body := a.body
	if out, ok := anthropicError(a.status, body, isJSONType(a.Header().Get("Content-Type"))); ok {
		body = out
		h := a.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Del("Content-Encoding")
	}
	a.release(body)
}

// anthropicError reshapes an error body into Anthropic's: an OpenAI-shaped one
// ({"error":{"message",...}}) keeps its message; any other but Anthropic's own (a worker's plain
// text, HTML) becomes the message, cut to anthropicMessageMax bytes of valid UTF-8. ok is false
// for a body already in Anthropic's shape, or a JSON body of another shape, which pass unchanged.
func anthropicError(status int, body []byte, isJSON bool) ([]byte, bool) {
	var in struct {
		Type  *string `json:"type"`
		Error *struct {
			Message *string `json:"message"`
		} `json:"error"`
	}
	var msg string
	switch err := json.Unmarshal(body, &in); {
	case err == nil && in.Type == nil && in.Error != nil && in.Error.Message != nil:
		msg = *in.Error.Message
	case err == nil || isJSON:
		return nil, false
	default:
		text := strings.ToValidUTF8(string(body[:min(len(body), anthropicMessageMax)]), "")
		msg = strings.TrimSpace(http.StatusText(status) + ": " + strings.TrimSpace(text))
	}
	type errObj struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	out, err := json.Marshal(struct {
		Type  string `json:"type"`
		Error errObj `json:"error"`
	}{"error", errObj{anthropicErrorType(status), msg}})
	if err != nil {
		return nil, false
	}
	return append(out, '\n'), true
}

// anthropicStreamError rewrites one write that is, whole, an OpenAI-shaped SSE error event
// (what the gateway writes to end a stream that broke, and what an engine may send) followed
// or not by "data: [DONE]", into Anthropic's error event: "event: error" with
// {"type":"error","error":{"type","message"}}. ok is false for anything else, which passes.
func anthropicStreamError(b []byte) ([]byte, bool) {
	const prefix, done = "data: {\"error\":", "data: [DONE]\n\n"
	lead := len(b) - len(bytes.TrimLeft(b, "\r\n"))
	ev := b[lead:]
	if len(b) > anthropicErrorMax || !bytes.HasPrefix(ev, []byte(prefix)) {
		return nil, false
	}
	ev = bytes.TrimSuffix(ev, []byte(done))
	data, rest, ok := bytes.Cut(ev[len("data: "):], []byte("\n\n"))
	if !ok || len(bytes.TrimSpace(rest)) > 0 {
		return nil, false
	}
	var in struct {
		Error *struct {
			Message *string `json:"message"`
			Code    any     `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &in) != nil || in.Error == nil || in.Error.Message == nil {
		return nil, false
	}
	typ := "api_error"
	if in.Error.Code == "gateway_shutting_down" {
		typ = "overloaded_error"
	}
	out, err := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": *in.Error.Message}})
	if err != nil {
		return nil, false
	}
	buf := make([]byte, 0, lead+len(out)+len("event: error\ndata: \n\n"))
	buf = append(buf, b[:lead]...)
	buf = append(buf, "event: error\ndata: "...)
	buf = append(append(buf, out...), "\n\n"...)
	return buf, true
}

// anthropicErrorType is the Anthropic error type of an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// isJSONType reports whether a Content-Type is JSON.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || bytes.HasSuffix([]byte(mt), []byte("+json")))
}
