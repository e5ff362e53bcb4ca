package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// TestRegisterUntilDone: a configured worker that is still starting is retried until it answers,
// the wait doubling from --register-retry (on a synctest bubble's clock: the third probe comes
// 5 + 10 ms after the first); the caller hears after the first attempt; a registration that can
// never succeed is not retried.
func TestRegisterUntilDone(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		var probes atomic.Int32
		srv := mn.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if probes.Add(1) <= 2 {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`)
		}))
		t.Cleanup(srv.Close)
		g := newTestGatewayOn(t, mn, Config{RegisterRetry: 5 * time.Millisecond}, "round_robin")
		tried := make(chan struct{})
		done := make(chan struct{})
		start := time.Now()
		go func() {
			defer close(done)
			g.RegisterUntilDone(context.Background(), AddWorkerRequest{URL: srv.URL}, func() { close(tried) })
		}()
		testutil.Recv(t, tried, "the first attempt")
		testutil.Recv(t, done, "the registration")
		if took := time.Since(start); took != 15*time.Millisecond {
			t.Errorf("registered %v after the first probe, want 15ms (5 ms, then 10)", took)
		}
		if n := len(g.reg.View().All); n != 1 || probes.Load() != 3 {
			t.Fatalf("%d workers after %d probes; want 1 after 3", n, probes.Load())
		}

		// A bad registration is refused at once, not retried.
		before := probes.Load()
		g.RegisterUntilDone(context.Background(), AddWorkerRequest{URL: srv.URL + "/other", Labels: map[string]string{"policy": "nope"}}, nil)
		if probes.Load() != before {
			t.Error("an invalid registration was probed")
		}

		// Cancelled while the worker is unreachable: it returns.
		dead := mn.NewServer(http.NotFoundHandler())
		dead.Close()
		ctx, cancel := context.WithCancel(context.Background())
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			g.RegisterUntilDone(ctx, AddWorkerRequest{URL: dead.URL}, nil)
		}()
		cancel()
		testutil.Recv(t, returned, "RegisterUntilDone to return after its context ended")
	})
}
