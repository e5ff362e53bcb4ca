package drills

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
)

// TestDrillWorkerFrozen freezes one of two engines (it accepts connections and answers nothing,
// health checks included, as a SIGSTOPped process does) under 10 non-streamed clients. Before,
// the requests routed to it before its health checks noticed waited until the client gave up
// (90 s in the probe); now, once it fails its checks, every request waiting for its headers is
// sent to the other engine: none waits longer than the health bound plus its own time there.
func TestDrillWorkerFrozen(t *testing.T) {
	rc := defaultRig(2)
	rc.health.Interval, rc.health.Timeout, rc.health.FailureThreshold = 100*time.Millisecond, 300*time.Millisecond, 2
	// The health bound: the checks that fail after the freeze, each at its timeout, one interval apart.
	healthBound := rc.health.Interval + time.Duration(rc.health.FailureThreshold)*(rc.health.Timeout+rc.health.Interval)
	const onOther = 2 * time.Second // generous: a short completion on a loaded machine
	r := newRig(t, rc)
	victim := r.workers[0]
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var longest time.Duration
	tl := &tally{}
	var wg sync.WaitGroup
	for c := range 10 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				start := time.Now()
				tl.add(r.do(context.Background(), chatBody(c*100000+i, 8, false), false, nil))
				mu.Lock()
				longest = max(longest, time.Since(start))
				mu.Unlock()
			}
		})
	}
	sleepUntil(300 * time.Millisecond)
	frozen := time.Now()
	r.engines[0].sim().SetFaults(sim.Faults{Hang: true})
	shed, ok := r.events.waitFor(frozen, 10*time.Second, shedEvent(victim))
	if !ok {
		cancel()
		wg.Wait()
		t.Fatal("the frozen worker was never shed")
	}
	sleepUntil(500 * time.Millisecond) // load keeps flowing with the worker gone
	cancel()
	wg.Wait()
	tl.wantAllOK(t, "completions")
	if longest > healthBound+onOther {
		t.Errorf("a request waited %v, past the health bound %v plus %v on the other engine", longest, healthBound, onOther)
	}
	r.engines[0].sim().SetFaults(sim.Faults{})
	r.settle()
	report(row{drill: "worker frozen (2 engines, 10 clients)", requests: tl.requests, failures: tl.failed(),
		shed: shed.at.Sub(frozen), note: shedNote(shed) + "; longest request " + longest.Round(time.Millisecond).String()})
}
