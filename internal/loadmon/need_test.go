package loadmon

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestPollingStartsOnNeed: an armed monitor polls nobody until a policy needs its load, then
// starts at once; a Need that came first starts it when armed; Stop disarms it.
func TestPollingStartsOnNeed(t *testing.T) {
	for _, needFirst := range []bool{false, true} {
		polled := make(chan struct{}, 1)
		w, _ := fakeWorker(t, worker.Spec{Models: []string{"m"}, Runtime: "sglang"}, map[string]http.Handler{
			"/v1/loads": http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				select {
				case polled <- struct{}{}:
				default:
				}
				rw.Write([]byte(`{"loads":[{"num_running_reqs":1}]}`))
			}),
		})
		reg := worker.NewRegistry()
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
		m := New(reg, Config{Interval: time.Hour})
		ctx, cancel := context.WithCancel(context.Background())
		if needFirst {
			m.Need()
		}
		m.StartOnNeed(ctx)
		if !needFirst {
			// Armed but not needed: nothing runs (a poll round would have been started by now
			// if it were; Need below must be what starts it).
			m.runMu.Lock()
			running := m.cancel != nil
			m.runMu.Unlock()
			if running {
				t.Fatal("polling started before any policy needed it")
			}
			m.Need()
		}
		select {
		case <-polled:
		case <-time.After(10 * time.Second):
			t.Fatalf("needFirst=%v: no poll after Need", needFirst)
		}
		cancel()
		m.Stop()
		m.Need() // disarmed: must not start again
		m.runMu.Lock()
		running := m.cancel != nil
		m.runMu.Unlock()
		if running {
			t.Error("a stopped monitor started again on Need")
		}
	}
}
