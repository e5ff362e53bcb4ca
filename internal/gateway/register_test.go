package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestRegisterUntilDone: a configured worker that is still starting is retried until it answers;
// the caller hears after the first attempt; a registration that can never succeed is not retried.
func TestRegisterUntilDone(t *testing.T) {
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probes.Add(1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`)
	}))
	t.Cleanup(srv.Close)
	g := newTestGateway(t, Config{RegisterRetry: 5 * time.Millisecond}, "round_robin")
	tried := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.RegisterUntilDone(context.Background(), AddWorkerRequest{URL: srv.URL}, func() { close(tried) })
	}()
	for _, c := range []chan struct{}{tried, done} {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatal("registration never finished")
		}
	}
	if n := len(g.reg.View().All); n != 1 || probes.Load() != 3 {
		t.Fatalf("%d workers after %d probes; want 1 after 3", n, probes.Load())
	}

	// A bad registration is refused at once, not retried.
	start := probes.Load()
	g.RegisterUntilDone(context.Background(), AddWorkerRequest{URL: srv.URL + "/other", Labels: map[string]string{"policy": "nope"}}, nil)
	if probes.Load() != start {
		t.Error("an invalid registration was probed")
	}

	// Cancelled while the worker is unreachable: it returns.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		g.RegisterUntilDone(ctx, AddWorkerRequest{URL: dead.URL}, nil)
	}()
	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("RegisterUntilDone did not return after its context ended")
	}
}
