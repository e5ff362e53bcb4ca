package tracing

import (
	"net/http"
	"testing"
)

// idleCloser counts CloseIdleConnections calls.
type idleCloser struct {
	http.RoundTripper
	closed int
}

func (c *idleCloser) CloseIdleConnections() { c.closed++ }

// TestTransportClosesIdleConnections: an http.Client over the tracing transport reaches the
// wrapped transport's CloseIdleConnections (a stopping gateway closes its idle sockets).
func TestTransportClosesIdleConnections(t *testing.T) {
	base := &idleCloser{RoundTripper: http.DefaultTransport}
	(&http.Client{Transport: &transport{base: base}}).CloseIdleConnections()
	if base.closed != 1 {
		t.Fatalf("the wrapped transport's CloseIdleConnections ran %d times, want 1", base.closed)
	}
}
