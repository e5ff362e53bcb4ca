package gateway

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzAskUsage: a body asked for usage stays the same JSON object with stream_options added,
// and anything else is left alone.
func FuzzAskUsage(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, ` {"a":1}`, `{"stream_options":{}}`, `{}`, `[1]`, `{"a":`, `{"STREAM_OPTIONS":null,"b":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, ok := askUsage(body)
		if !ok {
			if !bytes.Equal(out, body) {
				t.Fatal("a body not asked was changed")
			}
			return
		}
		if !json.Valid(body) {
			return // the scanner accepted what encoding/json does not: nothing more to compare
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			return
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%q became invalid %q: %v", body, out, err)
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if json.Unmarshal(after["stream_options"], &so) != nil || !so.IncludeUsage {
			t.Fatalf("%q: stream_options %s", out, after["stream_options"])
		}
		if len(after) != len(before)+1 {
			t.Fatalf("%q → %q: members %d → %d", body, out, len(before), len(after))
		}
	})
}

// FuzzDropUsageEvents: what is dropped is only whole usage-only events; nothing else changes.
func FuzzDropUsageEvents(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[],\"usage\":null}\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := dropUsageEvents(b)
		if len(out) > len(b) {
			t.Fatal("grew")
		}
		// Every event kept is one of b's, in order: b with the dropped events removed.
		rest := b
		for len(out) > 0 {
			n := eventLen(rest)
			if n == 0 {
				if !bytes.Equal(out, rest) {
					t.Fatalf("tail %q, want %q", out, rest)
				}
				return
			}
			if bytes.HasPrefix(out, rest[:n]) {
				out = out[n:]
			} else if !isUsageOnlyEvent(rest[:n]) {
				t.Fatalf("dropped %q, not a usage-only event", rest[:n])
			}
			rest = rest[n:]
		}
	})
}

// FuzzAnswerTokens: the reader never panics and never reports a negative count or an empty
// prompt.
func FuzzAnswerTokens(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`{"text":"x","meta_info":{"prompt_tokens":10,"cached_tokens":3}}`))
	f.Add([]byte(`{"meta_info":{"prompt_tokens":-1,"cached_tokens":"a"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, ok := answerTokens(b)
		if ok && (p <= 0 || c < 0) {
			t.Fatalf("%q: prompt %d cached %d", b, p, c)
		}
	})
}
