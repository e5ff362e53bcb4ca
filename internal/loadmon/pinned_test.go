package loadmon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestPinnedAgreesWithTheMonitor: a pinned view answers what the monitor answers for the same
// snapshot and instant, and keeps answering from its snapshot and its instant after the monitor
// has moved on.
func TestPinnedAgreesWithTheMonitor(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"loads":[{"num_running_reqs":3,"num_waiting_reqs":2,"num_waiting_uncached_tokens":700,"max_running_requests":8}]}`)
	}))
	t.Cleanup(srv.Close)
	reg := worker.NewRegistry()
	w, err := worker.New(worker.Spec{URL: srv.URL, Runtime: "sglang"}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	if err := reg.Add(w); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	mon := New(reg, Config{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }, Mode: ModeScaled})
	t.Cleanup(mon.Stop)
	mon.PollOnce(context.Background())
	done := w.Acquire()
	defer done()
	pin := mon.Pin()
	load, r, fresh := pin.Sample(w)
	want, wantOK := mon.Report(w)
	if !fresh || !wantOK || r != want || load != mon.Load(w) {
		t.Fatalf("pinned %v %+v %v, monitor %v %+v %v", load, r, fresh, mon.Load(w), want, wantOK)
	}
	if r.MaxRunning != 8 || r.WaitingUncachedTokens != 700 {
		t.Fatalf("report %+v", r)
	}
	if r2, ok := pin.Report(w); !ok || r2 != r {
		t.Fatalf("Report %+v %v, want Sample's", r2, ok)
	}
	now = now.Add(time.Hour) // the monitor's view goes stale; the pinned one keeps its instant
	if _, ok := mon.Report(w); ok {
		t.Fatal("the monitor's report is still fresh an hour later")
	}
	if _, ok := pin.Report(w); !ok {
		t.Fatal("the pinned view changed its instant")
	}
	if _, _, ok := mon.Pin().Sample(w); ok {
		t.Fatal("a view pinned an hour later calls the report fresh")
	}
	var zero Pinned
	if l, _, ok := zero.Sample(w); ok || l != w.Inflight() {
		t.Fatalf("the zero view: %v %v, want local load and nothing fresh", l, ok)
	}
}
