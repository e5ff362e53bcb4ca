package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestEngineGoneAfterReset: an attempt whose connection closed before any answer is sent
// elsewhere only where the engine now refuses connections, for every form net/http gives that
// close in. A live listener keeps the attempt a transport failure (its engine may be working).
func TestEngineGoneAfterReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	live := "http://" + ln.Addr().String()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + dead.Addr().String()
	_ = dead.Close()
	t.Cleanup(func() { _ = ln.Close() })

	closes := map[string]error{
		"reset":       fmt.Errorf("read tcp: %w", syscall.ECONNRESET),
		"broken pipe": fmt.Errorf("write tcp: %w", syscall.EPIPE),
		"EOF":         io.EOF,
		"before":      errors.New("net/http: server closed connection before response was received"),
		// net/http's errServerClosedIdle, returned for a fresh connection it does not resend on.
		"idle": errors.New("http: server closed idle connection"),
	}
	for name, cerr := range closes {
		for url, want := range map[string]bool{gone: true, live: false} {
			w, err := worker.New(worker.Spec{URL: url, Models: []string{"m"}}, worker.BreakerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			a := &attempt{w: w}
			if got := a.refusedAfterReset(cerr); got != want {
				t.Errorf("%s, engine listening %v: gone = %v, want %v", name, !want, got, want)
			}
		}
	}
	w, err := worker.New(worker.Spec{URL: gone, Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if (&attempt{w: w}).refusedAfterReset(errors.New("tls: bad certificate")) {
		t.Error("an error that is no close before the answer was taken for a dead engine")
	}
}
