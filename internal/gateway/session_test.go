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
	if k := sessionKey(http.Header{}, &p); k != "alice" {
		t.Fatalf("key %q, want the body's user", k)
	}
	h := http.Header{}
	h.Set("X-Session-Id", "s1")
	if k := sessionKey(h, &p); k != "s1" {
		t.Fatalf("key %q, want the session header", k)
	}
	h.Set("X-Kvgate-Routing-Key", "r1")
	if k := sessionKey(h, &p); k != "r1" {
		t.Fatalf("key %q, want the routing-key header", k)
	}
	p, err = parseBody([]byte(`{"user":42,"messages":[]}`), nil, kindChat, 10)
	if err != nil || p.User != "" {
		t.Fatalf("a non-string user: %+v, %v; want it ignored", p, err)
	}
}
