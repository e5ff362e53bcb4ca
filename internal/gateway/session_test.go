package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestSessionKey: headers win over the body's user; the parser reads a top-level string user
// only, and measures the whole routing text even when it keeps a prefix of it.
func TestSessionKey(t *testing.T) {
	body := `{"model":"m","messages":[{"content":"` + strings.Repeat("a", 100) + `","user":"not-this"}],"user":"alice"}`
	p, err := parseBody([]byte(body), nil, kindChat, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.User != "alice" || len(p.Text) != 10 || p.TextBytes != 100 {
		t.Fatalf("user %q, text %d bytes of %d; want alice, 10 of 100", p.User, len(p.Text), p.TextBytes)
	}
	srv := &Server{sessionHeaders: DefaultSessionHeaders}
	if k, aff := srv.sessionKeys(http.Header{}, &p); k != "alice" || aff != "" {
		t.Fatalf("key %q affinity %q, want the body's user and no affinity", k, aff)
	}
	h := http.Header{}
	h.Set("X-Session-Id", "s1")
	if k, _ := srv.sessionKeys(h, &p); k != "s1" {
		t.Fatalf("key %q, want the session header", k)
	}
	h.Set("X-Kvgate-Routing-Key", "r1")
	if k, _ := srv.sessionKeys(h, &p); k != "r1" {
		t.Fatalf("key %q, want the routing-key header", k)
	}
	p, err = parseBody([]byte(`{"user":42,"messages":[]}`), nil, kindChat, 10)
	if err != nil || p.User != "" {
		t.Fatalf("a non-string user: %+v, %v; want it ignored", p, err)
	}
}

// TestSessionKeysPrecedence: the documented order (docs/api.md, "Affinity keys"): the
// routing-key header, the session headers in their configured order, prompt_cache_key,
// conversation, then the user (x-user-id, the body's user), which is a session key but no
// affinity key.
func TestSessionKeysPrecedence(t *testing.T) {
	body := `{"messages":[],"user":"u","prompt_cache_key":"pck","conversation":{"id":"conv_1"}}`
	cases := []struct {
		name      string
		headers   map[string]string
		body      string
		key, aff  string
		configure []string
	}{
		{name: "routing key first", headers: map[string]string{"X-Kvgate-Routing-Key": "r", "X-Session-Id": "s"}, body: body, key: "r", aff: "h\x00r"},
		{name: "session header", headers: map[string]string{"X-Conversation-Id": "c", "X-User-Id": "uid"}, body: body, key: "c", aff: "h\x00c"},
		{name: "configured header order", headers: map[string]string{"X-Session-Id": "s", "Session-Id": "t"}, body: body, key: "t", aff: "h\x00t", configure: []string{"Session-Id", "X-Session-Id"}},
		{name: "a default header not configured", headers: map[string]string{"X-Session-Id": "s"}, body: body, key: "pck", aff: "k\x00pck", configure: []string{"Session-Id"}},
		{name: "prompt_cache_key before conversation", body: body, key: "pck", aff: "k\x00pck"},
		{name: "conversation object", body: `{"conversation":{"id":"conv_1"},"user":"u"}`, key: "conv_1", aff: "c\x00conv_1"},
		{name: "conversation string", body: `{"conversation":"conv_2"}`, key: "conv_2", aff: "c\x00conv_2"},
		{name: "user header before body user", headers: map[string]string{"X-User-Id": "uid"}, body: `{"user":"u"}`, key: "uid"},
		{name: "a prompt_cache_key not a string is no key", body: `{"prompt_cache_key":7,"user":"u"}`, key: "u"},
		{name: "an empty prompt_cache_key is no key", body: `{"prompt_cache_key":"","conversation":"c"}`, key: "c", aff: "c\x00c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseBody([]byte(tc.body), nil, kindResponses, 64)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			srv := &Server{sessionHeaders: DefaultSessionHeaders}
			if tc.configure != nil {
				srv.sessionHeaders = tc.configure
			}
			if key, aff := srv.sessionKeys(h, &p); key != tc.key || aff != tc.aff {
				t.Fatalf("key %q affinity %q, want %q %q", key, aff, tc.key, tc.aff)
			}
		})
	}
}
