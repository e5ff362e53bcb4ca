package drills

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
)

// arrived is the requests that have reached an engine since it started.
func (e *engine) arrived() int64 {
	l := e.sim().Load()
	return int64(l.Running+l.Waiting) + l.Finished + l.Aborted
}

// TestDrillDrain removes one worker with DELETE /workers/{id} and makes another fail its health
// checks, each while streams run on it and short completions flow. The streams already on them
// finish whole; no new request reaches them; clients see no error.
func TestDrillDrain(t *testing.T) {
	r := newRig(t, defaultRig(3))
	removed, sick := r.workers[0], r.workers[1]
	streams := r.startStreams(6, 200) // two per engine
	l := r.load(6, 8)
	sleepUntil(200 * time.Millisecond)

	admin := httptest.NewServer(r.gw.AdminHandler())
	defer admin.Close()
	req, _ := http.NewRequest(http.MethodDelete, admin.URL+"/workers/"+removed.ID, nil)
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE answered %d", resp.StatusCode)
	}
	// A request counted in flight when the drain began may still reach the engine; no other
	// may. Read the count before the engine's, so that the bound is safe.
	inflightAtDelete := removed.Inflight()
	arrivedAtDelete := r.engines[0].arrived()
	if inflightAtDelete == 0 {
		t.Fatal("nothing was in flight on the removed worker: the drill proves nothing")
	}

	failing := time.Now()
	r.engines[1].sim().SetFaults(sim.Faults{SlowStart: time.Hour}) // every new request and check: 503
	shed, ok := r.events.waitFor(failing, 5*time.Second, shedEvent(sick))
	if !ok {
		t.Fatal("the sick worker was never shed")
	}
	picks := `kvgate_policy_selections_total{model="kvgate-sim",policy="round_robin",worker="` + sick.ID + `"}`
	picksAtShed := r.metric(picks)
	sleepUntil(500 * time.Millisecond)
	tl := l.stop()

	for _, o := range collect(t, streams, 6, 20*time.Second) {
		if !o.ok {
			t.Errorf("a stream was cut: %s", o)
		}
	}
	tl.wantAllOK(t, "completions")
	if n := r.engines[0].arrived() - arrivedAtDelete; n > inflightAtDelete {
		t.Errorf("%d requests reached the removed worker after DELETE, more than the %d in flight then", n, inflightAtDelete)
	}
	// A pick racing the transition may still count; one per client at most.
	latePicks := r.metric(picks) - picksAtShed
	if latePicks > 6 {
		t.Errorf("the not-ready worker was picked %v times after it was shed", latePicks)
	}
	r.settle()
	report(row{drill: "drain: DELETE /workers/{id}, and a worker failing health, with streams on both", requests: tl.requests + 6,
		failures: tl.failed(), shed: shed.at.Sub(failing),
		note: "DELETE sheds at once; shed = health failing → not_ready; the 4 streams on the two drained workers finished whole; picks of the not-ready worker after the shed: " + strconv.Itoa(int(latePicks))})
}
