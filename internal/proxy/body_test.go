package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

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
	req := &Request{Path: "/v1/completions", Header: http.Header{}, Body: []byte(`{"prompt":"p"}`), BodyRef: ref}
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
	if got := <-lr.read; got != `{"prompt":"p"}` {
		t.Errorf("the transport read %q", got)
	}
	if n := ref.n.Load(); n != 0 {
		t.Errorf("%d holders once the transport closed the body, want 0", n)
	}
}
