package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// anthropicStream is a streamed Messages answer as vLLM sends it: named events, no [DONE].
const anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
	"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

const anthropicMessage = `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":2}}`

// The Anthropic request shapes — text, a system prompt as blocks, tools, an image by URL,
// streaming — reach the worker byte for byte on its /v1/messages (and count_tokens), and the
// worker's answer reaches the client byte for byte, a stream's named events included. The
// client's x-api-key is the gateway's key and goes no further.
func TestMessagesRelayedUnchanged(t *testing.T) {
	f := newFakeWorker(t, "m")
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == countTokensPath:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"input_tokens":5}`)
		case strings.Contains(readAll(r.Body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range strings.SplitAfter(anthropicStream, "\n\n") {
				io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, anthropicMessage)
		}
	})
	g := newTestGateway(t, Config{APIKeys: []string{"client=sk-test"}}, "cache_aware", f)
	bodies := []struct {
		name, path, body, want string
	}{
		{"text", messagesPath, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}`, anthropicMessage},
		{"system and tools", messagesPath, `{"model":"m","max_tokens":16,"system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"sunny"}]}]}`, anthropicMessage},
		{"image by URL", messagesPath, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}},{"type":"text","text":"What is this?"}]}]}`, anthropicMessage},
		{"stream", messagesPath, `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`, anthropicStream},
		{"count_tokens", countTokensPath, `{"model":"m","messages":[{"role":"user","content":"Hello"}]}`, `{"input_tokens":5}`},
	}
	for i, tc := range bodies {
		t.Run(tc.name, func(t *testing.T) {
			resp := g.post(t, tc.path, tc.body, "X-Api-Key", "sk-test", "Anthropic-Version", "2023-06-01")
			got := readAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || got != tc.want {
				t.Fatalf("status %d, body %q; want 200 and %q", resp.StatusCode, got, tc.want)
			}
			f.mu.Lock()
			sent, hdr := string(f.bodies[i]), f.headers[i]
			f.mu.Unlock()
			if sent != tc.body {
				t.Fatalf("the worker got %q, want the client's body %q", sent, tc.body)
			}
			if hdr.Get("X-Api-Key") != "" || hdr.Get("Authorization") != "" || hdr.Get("Anthropic-Version") != "2023-06-01" {
				t.Fatalf("the worker got x-api-key %q, authorization %q, anthropic-version %q", hdr.Get("X-Api-Key"), hdr.Get("Authorization"), hdr.Get("Anthropic-Version"))
			}
		})
	}
}

func readAll(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}

// anthropicErr asserts Anthropic's error shape and returns its type.
func anthropicErr(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	raw := readAll(resp.Body)
	var e struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(raw), &e) != nil || e.Type != "error" || e.Error == nil || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("status %d: not an Anthropic error: %s", resp.StatusCode, raw)
	}
	return e.Error.Type
}

// Every error a Messages client gets is in Anthropic's shape with the status the gateway chose:
// the gateway's own (a bad key, a malformed body, an unknown model, no worker), a worker's 5xx
// it replaces, a worker's error in the OpenAI shape; a worker's error already in Anthropic's
// shape passes unchanged.
func TestMessagesErrorsInAnthropicShape(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{APIKeys: []string{"client=sk-test"}, Proxy: proxyTimeout(5 * time.Second)}, "round_robin", f)
	ok := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, body, key string
		worker          http.HandlerFunc
		status          int
		typ             string
	}{
		{name: "bad key", body: ok, key: "wrong", status: 401, typ: "authentication_error"},
		{name: "malformed body", body: `{"messages":{}}`, key: "sk-test", status: 400, typ: "invalid_request_error"},
		{name: "unknown model", body: `{"model":"nope","messages":[]}`, key: "sk-test", status: 404, typ: "not_found_error"},
		{name: "worker 500", body: ok, key: "sk-test", status: 500, typ: "api_error", worker: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom at 10.0.0.7", http.StatusInternalServerError)
		}},
		{name: "worker OpenAI-shaped 400", body: ok, key: "sk-test", status: 400, typ: "invalid_request_error", worker: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"max_tokens too large","type":"BadRequestError","param":null,"code":400}}`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.setHandler(tc.worker)
			resp := g.post(t, messagesPath, tc.body, "X-Api-Key", tc.key)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if typ := anthropicErr(t, resp); typ != tc.typ {
				t.Fatalf("error type %q, want %q", typ, tc.typ)
			}
		})
	}
	own := `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: field required"}}`
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, own)
	})
	resp := g.post(t, messagesPath, ok, "X-Api-Key", "sk-test")
	if got := readAll(resp.Body); resp.StatusCode != 400 || got != own {
		t.Fatalf("a worker's own Anthropic error: %d %q, want it unchanged", resp.StatusCode, got)
	}
	resp.Body.Close()
	empty := newTestGateway(t, Config{}, "round_robin")
	if resp := empty.post(t, countTokensPath, ok); resp.StatusCode != 503 || anthropicErr(t, resp) != "overloaded_error" {
		t.Fatalf("no workers: %d, want 503 overloaded_error", resp.StatusCode)
	}
}

// namedEvents reads the event names of an SSE stream, checking each data line is JSON whose type
// is the event's name.
func namedEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var names []string
	sc := bufio.NewScanner(r)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil || d.Type != name {
				t.Fatalf("event %q with data %s", name, line)
			}
			names = append(names, name)
		}
	}
	return names
}

// checkMessagesEngine sends a Messages request whole and streamed, and count_tokens, through g to
// a real engine, and checks what a client sees.
func checkMessagesEngine(t *testing.T, g *testGateway, model string, countTokens bool) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"system":"You are a terse assistant.","messages":[{"role":"user","content":[{"type":"text","text":"Say hello."}]}]}`, model)
	resp := g.post(t, messagesPath, body)
	var msg struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type, Text string
		} `json:"content"`
	}
	raw := readAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || json.Unmarshal([]byte(raw), &msg) != nil || msg.Type != "message" || msg.Role != "assistant" || len(msg.Content) == 0 || msg.Content[0].Text == "" {
		t.Fatalf("messages: %d %s", resp.StatusCode, raw)
	}
	resp = g.post(t, messagesPath, strings.Replace(body, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1))
	names := namedEvents(t, resp.Body)
	resp.Body.Close()
	if len(names) < 5 || names[0] != "message_start" || names[len(names)-1] != "message_stop" || !containsString(names, "content_block_delta") {
		t.Fatalf("stream: %d, events %v", resp.StatusCode, names)
	}
	resp = g.post(t, countTokensPath, body)
	if !countTokens {
		// The engine serves no count_tokens: its plain-text 404 reaches the client in
		// Anthropic's shape.
		if resp.StatusCode != http.StatusNotFound || anthropicErr(t, resp) != "not_found_error" {
			t.Fatalf("count_tokens on an engine without it: %d", resp.StatusCode)
		}
		return
	}
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	raw = readAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || json.Unmarshal([]byte(raw), &count) != nil || count.InputTokens <= 0 {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, raw)
	}
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// kvgate sim serves the Messages API, whole and streamed, through the gateway.
func TestMessagesThroughSim(t *testing.T) {
	g, _ := simGateway(t, "cache_aware", 2)
	checkMessagesEngine(t, g, "m", true)
}

// The foreign engine (llm-d-inference-sim, vLLM's API) serves the Messages API through the
// gateway, whole and streamed. It serves no count_tokens: its 404 reaches the client in
// Anthropic's shape. Skipped where its binary is absent.
func TestMessagesThroughLLMDSim(t *testing.T) {
	e := testutil.StartLLMDSim(t, "llmd-model", "--zmq-endpoint", "", "--mode", "random")
	g := newTestGateway(t, Config{}, "cache_aware")
	g.mustRegister(t, AddWorkerRequest{URL: e.URL})
	checkMessagesEngine(t, g, "llmd-model", false) // it serves no /v1/messages/count_tokens
}

// A Messages stream that breaks after it started ends with Anthropic's error event (event:
// error, {"type":"error","error":{...}}), not the OpenAI-shaped one other routes get; the events
// before it are relayed unchanged.
func TestMessagesBrokenStreamEndsWithAnthropicError(t *testing.T) {
	f := newFakeWorker(t, "m")
	first := strings.SplitAfter(anthropicStream, "\n\n")[0]
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the worker dies mid-stream
	})
	g := newTestGateway(t, Config{}, "round_robin", f)
	resp := g.post(t, messagesPath, `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	got := readAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(got, first) {
		t.Fatalf("the stream's start was not relayed: %q", got)
	}
	tail := strings.TrimLeft(strings.TrimPrefix(got, first), "\n")
	if !strings.HasPrefix(tail, "event: error\ndata: ") || strings.Contains(tail, "[DONE]") {
		t.Fatalf("the stream ended with %q, want Anthropic's error event", tail)
	}
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	data := strings.TrimSpace(strings.TrimPrefix(tail, "event: error\ndata: "))
	if json.Unmarshal([]byte(data), &e) != nil || e.Type != "error" || e.Error.Type != "api_error" || e.Error.Message == "" {
		t.Fatalf("error event data %q", data)
	}
}

// FuzzAnthropicStreamError: the rewrite of a stream write never panics, and what it writes is
// one Anthropic error event whose data is valid JSON.
func FuzzAnthropicStreamError(f *testing.F) {
	f.Add([]byte("data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"param\":null,\"code\":\"c\"}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("\n\ndata: {\"error\":{\"message\":\"m\"}}\n\n"))
	f.Add([]byte("event: content_block_delta\ndata: {}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, ok := anthropicStreamError(b)
		if !ok {
			return
		}
		ev := strings.TrimLeft(string(out), "\r\n")
		data, found := strings.CutPrefix(ev, "event: error\ndata: ")
		if !found || !strings.HasSuffix(data, "\n\n") || !json.Valid([]byte(strings.TrimSuffix(data, "\n\n"))) {
			t.Fatalf("%q rewritten to %q", b, out)
		}
	})
}
