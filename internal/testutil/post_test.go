package testutil

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// recorder is a testing.TB that records Errorf instead of failing.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors int
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(string, ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors++
}

// TestPostOK: the bearer, content type and extra headers reach the server, a 200's header and
// body come back, and a non-200 or an unreachable server is an error with a nil header.
func TestPostOK(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Seen", r.Header.Get("X-Extra"))
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	rec := &recorder{TB: t}
	h, b := PostOK(rec, srv.URL, "k", "{}", "X-Extra", "v")
	if h == nil || h.Get("X-Seen") != "v" || string(b) != "ok" || rec.errors != 0 {
		t.Fatalf("a 200: header %v, body %q, %d errors", h, b, rec.errors)
	}
	if h, _ := PostOK(rec, srv.URL, "", "{}"); h != nil || rec.errors != 1 {
		t.Fatalf("a 401: header %v, %d errors, want nil and 1", h, rec.errors)
	}
	srv.Close()
	if h, _ := PostOK(rec, srv.URL, "k", "{}"); h != nil || rec.errors != 2 {
		t.Fatalf("a closed server: header %v, %d errors, want nil and 2", h, rec.errors)
	}
}
