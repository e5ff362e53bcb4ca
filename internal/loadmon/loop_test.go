package loadmon

import (
	"context"
	"fmt"
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
				m := New(reg, Config{Interval: time.Second, Transport: tr,
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

// hangTransport answers like memTransport, except that a request to a host named "hang…" waits
// until its context ends.
type hangTransport struct{ memTransport }

func (tr *hangTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasPrefix(r.URL.Hostname(), "hang") {
		tr.requests.Add(1)
		<-r.Context().Done()
		return nil, context.Cause(r.Context())
	}
	return tr.memTransport.RoundTrip(r)
}

// TestEachPollHasItsTimeout: one poller goroutine polls a hung worker, then a healthy one, over
// and over: each hung poll ends exactly Timeout after it began (fake time), with a timeout as
// its failure, and the healthy poll after it is not cut short by the deadline that fired.
func TestEachPollHasItsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		tr := &hangTransport{memTransport{body: busyLoads}}
		reg := worker.NewRegistry()
		m := New(reg, Config{Interval: time.Second, Timeout: timeout, Concurrency: 1,
			Transport: tr, Logger: slog.New(slog.DiscardHandler)})
		defer m.Stop()
		var hung, healthy []*worker.Worker
		for i := range 6 {
			host, list := "ok", &healthy
			if i%2 == 0 {
				host, list = "hang", &hung
			}
			w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://%s%d:8000", host, i), Runtime: "sglang"}, worker.BreakerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			w.SetHealth(worker.Ready)
			addWorkers(t, reg, w)
			*list = append(*list, w)
		}
		for round := range 2 {
			start := time.Now()
			m.PollOnce(t.Context())
			if took := time.Since(start); took != 3*timeout {
				t.Fatalf("round %d took %v, want 3 timeouts of %v", round, took, timeout)
			}
			s := m.Snapshot()
			for _, w := range healthy {
				if e, ok := s.Entry(w.ID); !ok || e.Report.Backlog() != 10 {
					f, _ := s.Failure(w.ID)
					t.Fatalf("round %d: healthy %s: entry %+v %v, failure %+v", round, w.Spec.URL, e, ok, f)
				}
			}
			for _, w := range hung {
				f, ok := s.Failure(w.ID)
				if !ok || !strings.Contains(f.Err, "timed out") {
					t.Fatalf("round %d: hung %s: failure %+v %v, want a timeout", round, w.Spec.URL, f, ok)
				}
			}
		}
		if got := tr.requests.Load(); got != 12 {
			t.Fatalf("%d requests, want 12", got)
		}
	})
}
