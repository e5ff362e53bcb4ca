package kvevents

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestTokenizerCachesThePromptNotTheBody: the same messages resent with other parameters are
// answered from the cache; other messages, or a plain prompt, ask the worker; a request whose
// context is gone is not tokenized.
func TestTokenizerCachesThePromptNotTheBody(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		var req map[string]json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		n := len(req["messages"]) + len(req["prompt"])
		toks := make([]uint32, n)
		json.NewEncoder(w).Encode(map[string]any{"count": n, "tokens": toks})
	}))
	t.Cleanup(srv.Close)
	via, err := worker.New(worker.Spec{URL: srv.URL}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tok := NewTokenizer(TokenizerConfig{Timeout: 5 * time.Second})
	ctx := context.Background()
	a := []byte(`{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`)
	b := []byte(`{"stream":true,"user":"u-1","messages":[{"role":"user","content":"hello there"}],"max_tokens":512,"model":"m"}`)
	c := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":"hi"}]}`)
	for i, body := range [][]byte{a, b, a} {
		toks, err := tok.Tokenize(ctx, via, "m", true, body, "")
		if err != nil || len(toks) == 0 {
			t.Fatalf("request %d: %v, %d tokens", i, err, len(toks))
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d /tokenize calls for one prompt sent three ways, want 1", n)
	}
	if _, err := tok.Tokenize(ctx, via, "m", true, c, ""); err != nil || calls.Load() != 2 {
		t.Fatalf("other messages: %v, %d calls, want 2", err, calls.Load())
	}
	if _, err := tok.Tokenize(ctx, via, "m", false, nil, "hello there"); err != nil || calls.Load() != 3 {
		t.Fatalf("a plain prompt: %v, %d calls, want 3", err, calls.Load())
	}
	if _, err := tok.Tokenize(ctx, via, "m", true, []byte(`{"model":"m"}`), ""); err == nil {
		t.Fatal("a chat body without messages was tokenized")
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := tok.Tokenize(gone, via, "m", false, nil, "a prompt nobody waits for"); err == nil {
		t.Fatal("tokenized for a client that left")
	}
	if st := tok.Stats(); st.Hits != 2 || st.Misses != 4 || st.Failures != 2 {
		t.Fatalf("stats %+v, want 2 hits, 4 misses, 2 failures", st)
	}
}

// A worker's /tokenize that redirects to another address is not followed: the tokenization
// fails (the request is routed by the tree) and the other host sees nothing.
func TestTokenizerFollowsNoRedirectAway(t *testing.T) {
	var reached atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		json.NewEncoder(w).Encode(map[string]any{"count": 1, "tokens": []uint32{7}})
	}))
	t.Cleanup(other.Close)
	away := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/tokenize", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(away.Close)
	via, err := worker.New(worker.Spec{URL: away.URL}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tok := NewTokenizer(TokenizerConfig{Timeout: 5 * time.Second})
	if _, err := tok.Tokenize(context.Background(), via, "m", false, nil, "hello"); err == nil {
		t.Fatal("tokenized by another host")
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the other host was reached %d times", n)
	}
}
