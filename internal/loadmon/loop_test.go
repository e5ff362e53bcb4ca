package loadmon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// memTransport answers every request from memory, so the poll loop can run inside a synctest
// bubble (fake time) without sockets.
type memTransport struct {
	requests atomic.Int64
	body     string
}

func (tr *memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	tr.requests.Add(1)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(tr.body)), ContentLength: -1, Request: r}, nil
}

func TestStartStop(t *testing.T) {
	tests := []struct {
		name string
		stop func(cancel context.CancelFunc, m *Monitor)
	}{
		{"Stop", func(_ context.CancelFunc, m *Monitor) { m.Stop() }},
		{"context cancel then Stop", func(cancel context.CancelFunc, m *Monitor) { cancel(); m.Stop() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &memTransport{body: busyLoads}
				reg := worker.NewRegistry()
				m := New(reg, Config{Interval: time.Second, Client: &http.Client{Transport: tr},
					Logger: slog.New(slog.DiscardHandler)})
				w, err := worker.New(worker.Spec{URL: "http://w0:8000", Runtime: "sglang"}, worker.BreakerConfig{})
				if err != nil {
					t.Fatal(err)
				}
				w.SetHealth(worker.Ready)
				addWorkers(t, reg, w)

				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				m.Start(ctx)
				m.Start(ctx) // a second Start is a no-op: still one loop
				synctest.Wait()
				if got := tr.requests.Load(); got != 1 {
					t.Fatalf("%d polls right after Start, want 1", got)
				}
				start := time.Now()
				time.Sleep(3500 * time.Millisecond) // fake time: three ticks
				synctest.Wait()
				if got := tr.requests.Load(); got != 4 {
					t.Fatalf("%d polls after 3.5 intervals, want 4", got)
				}
				if s := m.Snapshot(); s.Len() != 1 || s.At.Sub(start) != 3*time.Second || s.Round != 4 || s.Polled != 1 {
					t.Fatalf("snapshot at %v, round %d, %d polled, %d entries; want the 3s round (4th) with 1",
						s.At.Sub(start), s.Round, s.Polled, s.Len())
				}
				tt.stop(cancel, m)
				n := tr.requests.Load()
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if got := tr.requests.Load(); got != n {
					t.Fatalf("%d polls after Stop", got-n)
				}
				if _, ok := m.Snapshot().Entry(w.ID); !ok {
					t.Fatal("the last snapshot must stay readable after Stop")
				}
				if _, ok := m.Report(w); ok {
					t.Fatal("10s after the last poll the entry must be stale")
				}
				// A bubble fails the test if any goroutine is left when it ends: Stop waited.
			})
		})
	}
}
