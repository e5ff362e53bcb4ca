package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// countRef counts holders of a body.
type countRef struct{ n atomic.Int32 }

func (c *countRef) Retain()  { c.n.Add(1) }
func (c *countRef) Release() { c.n.Add(-1) }

// lateReader is a transport that answers at once and reads the request body only later, as the
// RoundTripper contract allows (net/http's own transport does it when a worker answers before
// reading), so a body must stay held after Forward returned.
type lateReader struct {
	read    chan string
	release chan struct{}
}

func (l *lateReader) RoundTrip(r *http.Request) (*http.Response, error) {
	go func() {
		<-l.release
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		l.read <- string(b)
	}()
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

func TestBodyHeldUntilTheTransportCloses(t *testing.T) {
	lr := &lateReader{read: make(chan string, 1), release: make(chan struct{})}
	f := New(Config{Transport: lr})
	w, err := worker.New(worker.Spec{URL: "http://127.0.0.1:1", Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	ref := &countRef{}
	ref.Retain() // the caller's own hold
	// Larger than smallBody: a small body is sent from a copy and never held.
	body := `{"prompt":"` + strings.Repeat("p", smallBody) + `"}`
	req := &Request{Path: "/v1/completions", Header: http.Header{}, Body: []byte(body), BodyRef: ref}
	res := f.Forward(context.Background(), httptest.NewRecorder(), req, func(tried []*worker.Worker) *worker.Worker {
		if len(tried) > 0 {
			return nil
		}
		return w
	})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	ref.Release()
	if n := ref.n.Load(); n != 1 {
		t.Fatalf("%d holders after Forward returned, want the transport's 1", n)
	}
	close(lr.release)
	if got := <-lr.read; got != body {
		t.Errorf("the transport read %d bytes, not the body", len(got))
	}
	if n := ref.n.Load(); n != 0 {
		t.Errorf("%d holders once the transport closed the body, want 0", n)
	}
}

// TestLargeBodyWrittenWhole: a body far larger than the transport's write buffer, written from
// memory by bodyConn, arrives byte for byte, on the first attempt and on a retry.
func TestLargeBodyWrittenWhole(t *testing.T) {
	body := make([]byte, 1<<20+3)
	for i := range body {
		body[i] = byte(i * 7)
	}
	a, b := newUpstream(t, status(http.StatusServiceUnavailable)), newUpstream(t, status(http.StatusOK))
	f := New(Config{Retry: RetryConfig{MaxAttempts: 2, InitialBackoff: time.Millisecond}})
	res := f.Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/v1/completions", Header: http.Header{}, Body: body},
		func(tried []*worker.Worker) *worker.Worker { return []*worker.Worker{a.w, b.w}[len(tried)%2] })
	if res.Status != http.StatusOK || res.Attempts != 2 {
		t.Fatalf("status %d after %d attempts (%v)", res.Status, res.Attempts, res.Err)
	}
	for i, up := range []*upstreamFake{a, b} {
		up.mu.Lock()
		if len(up.bodies) != 1 || up.bodies[0] != string(body) {
			t.Errorf("attempt %d: the worker got %d bodies, not the one sent", i+1, len(up.bodies))
		}
		up.mu.Unlock()
	}
}
