package testutil

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestMemNet: inside a synctest bubble a request over the in-memory network reaches its server
// with a loopback RemoteAddr, a handler's hour-long wait passes on the bubble's clock at once,
// a client deadline cuts a slow answer at its exact time, and a closed server refuses dials.
func TestMemNet(t *testing.T) {
	InBubble(t, func(t *testing.T, mn *MemNet) {
		srv := mn.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(time.Hour)
			}
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			io.WriteString(w, host)
		}))
		c := mn.Client()
		start := time.Now()
		resp, err := c.Get(srv.URL + "/slow")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "127.0.0.1" || time.Since(start) != time.Hour {
			t.Fatalf("answer %q after %v, want 127.0.0.1 after 1h", b, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/slow", nil)
		start = time.Now()
		if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Minute {
			t.Fatalf("a 1m deadline on a 1h answer: %v after %v", err, time.Since(start))
		}
		srv.Close()
		c.CloseIdleConnections()
		if _, err := c.Get(srv.URL); err == nil {
			t.Fatal("a closed server answered")
		}
	})
}
