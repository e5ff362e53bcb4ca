package drills

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// startStreams starts n streaming requests of maxTokens tokens and waits, bounded, until each has
// received its first event. The outcomes arrive on the returned channel.
func (r *rig) startStreams(n, maxTokens int) <-chan outcome {
	r.t.Helper()
	out := make(chan outcome, n)
	started := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		go func() {
			out <- r.do(context.Background(), chatBody(1000+i, maxTokens, true), true, func() { started <- struct{}{} })
		}()
	}
	timeout := time.After(10 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-started:
		case <-timeout:
			r.t.Fatalf("only %d of %d streams started", i, n)
		}
	}
	return out
}

// collect receives n outcomes, failing after a bound: a stream that never ends is a hang.
func collect(t *testing.T, ch <-chan outcome, n int, bound time.Duration) []outcome {
	t.Helper()
	timeout := time.After(bound)
	var out []outcome
	for len(out) < n {
		select {
		case o := <-ch:
			out = append(out, o)
		case <-timeout:
			t.Fatalf("only %d of %d streams ended within %v: a hang", len(out), n, bound)
		}
	}
	return out
}

// TestDrillWorkerKilled kills one of three engines while streams run on every engine and a
// steady load of short completions flows. With reset retries on, no completion may fail; the
// streams that were on the dead engine must end with an SSE error event and [DONE]; the others
// must finish normally.
func TestDrillWorkerKilled(t *testing.T) {
	rc := defaultRig(3)
	// A completion in flight on the engine when it dies ends in a reset before its headers. The
	// default retries (connect, 429, 503) re-send it: an engine that then refuses connections
	// is gone, and did no work a retry would duplicate (proxy/frozen.go). No opt-in.
	r := newRig(t, rc)
	victim := r.workers[0]
	streams := r.startStreams(6, 250)
	onVictim := r.engines[0].running()
	if onVictim == 0 {
		t.Fatal("no stream runs on the engine to be killed")
	}
	l := r.load(6, 8)
	sleepUntil(300 * time.Millisecond)
	killed := time.Now()
	r.engines[0].kill()
	shed, ok := r.events.waitFor(killed, 5*time.Second, shedEvent(victim))
	if !ok {
		t.Fatal("the dead worker was never shed")
	}
	sleepUntil(500 * time.Millisecond) // load keeps flowing with the worker gone
	tl := l.stop()
	broken := 0
	for _, o := range collect(t, streams, 6, 20*time.Second) {
		switch {
		case o.clear && o.status == 200 && strings.Contains(o.message, "stream broke"):
			broken++
		case !o.ok:
			t.Errorf("stream on a live engine: %s", o)
		}
	}
	if broken != onVictim {
		t.Errorf("%d streams ended with an SSE error event, want the %d that ran on the dead engine", broken, onVictim)
	}
	tl.wantAllOK(t, "completions")
	restarted := time.Now()
	r.engines[0].restart()
	back, ok := r.waitAvailable(victim, restarted, 5*time.Second)
	if !ok {
		t.Fatal("the restarted worker was never readmitted")
	}
	r.settle()
	report(row{drill: "worker killed mid-run (3 engines, 6 streams + 6 clients)", requests: tl.requests + 6,
		failures: tl.failed(), shed: shed.at.Sub(killed), recover: back,
		note: shedNote(shed) + "; " + strconv.Itoa(broken) + " streams on it ended with an SSE error event; recover = restart → ready"})
}

// TestDrillWorkerHangs makes one engine accept requests and never answer. Its requests time out
// after the attempt timeout and are retried elsewhere; its circuit opens; clients see nothing.
func TestDrillWorkerHangs(t *testing.T) {
	rc := defaultRig(3)
	rc.proxy.AttemptTimeout = 250 * time.Millisecond
	// A timed-out request may still run on the engine: re-sending it is the operator's choice.
	rc.proxy.Retry.On = proxy.DefaultRetryOn | proxy.RetryTimeout
	rc.health.Interval = 2 * time.Second // slow checks, so that the breaker is what sheds it
	r := newRig(t, rc)
	victim := r.workers[1]
	l := r.load(8, 8)
	sleepUntil(200 * time.Millisecond)
	hung := time.Now()
	r.engines[1].sim().SetFaults(sim.Faults{Hang: true})
	shed, ok := r.events.waitFor(hung, 10*time.Second, shedEvent(victim))
	if !ok {
		t.Fatal("the hung worker was never shed")
	}
	if shed.kind != "circuit" {
		t.Errorf("shed by %s, want the circuit breaker", shed.kind)
	}
	sleepUntil(300 * time.Millisecond)
	fixed := time.Now()
	r.engines[1].sim().SetFaults(sim.Faults{})
	back, ok := r.waitAvailable(victim, fixed, 10*time.Second)
	if !ok {
		t.Fatalf("the worker was never readmitted: health %s, circuit %s", victim.Health(), victim.Breaker.State(time.Now()))
	}
	sleepUntil(200 * time.Millisecond)
	tl := l.stop()
	tl.wantAllOK(t, "requests")
	if n := r.metric(`kvgate_retries_total{reason="timeout"}`); n == 0 {
		t.Error("no retry after a timeout was counted")
	}
	r.settle()
	report(row{drill: "worker hangs (attempt timeout 250 ms)", requests: tl.requests, failures: tl.failed(),
		shed: shed.at.Sub(hung), recover: back,
		note: shedNote(shed) + " after 10 timeouts; recover = fault cleared → circuit closed (1 s open timeout, counted from the opening, + 3 probes)"})
}

// TestDrillErrorStorm makes one engine answer half its requests with 503, under three breaker
// settings. Retries hide every error from clients in all three. Consecutive counting alone (10
// failures in a row) is not expected to shed the worker within the storm; the default breaker
// (which adds the failure-rate trigger, 50 % of the last 20) and a lower consecutive threshold
// shed it, and it is readmitted once the storm ends.
func TestDrillErrorStorm(t *testing.T) {
	cases := []struct {
		name   string
		set    func(*worker.BreakerConfig)
		shed   bool // whether the worker must be shed within the storm
		storm  time.Duration
		reason string
	}{
		{name: "default breaker (10 consecutive, or 50 % of the last 20)", set: func(*worker.BreakerConfig) {}, shed: true, storm: 2 * time.Second},
		{name: "consecutive failures only (--cb-failure-rate-threshold 0)", set: func(b *worker.BreakerConfig) { b.FailureRateThreshold = 0 }, storm: 2 * time.Second},
		{name: "--cb-failure-threshold 3", set: func(b *worker.BreakerConfig) { b.FailureThreshold = 3; b.FailureRateThreshold = 0 }, shed: true, storm: 1500 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := defaultRig(3)
			tc.set(&rc.breaker)
			r := newRig(t, rc)
			victim := r.workers[2]
			picks := `kvgate_policy_selections_total{model="kvgate-sim",policy="round_robin",worker="` + victim.ID + `"}`
			l := r.load(6, 8)
			sleepUntil(200 * time.Millisecond)
			storm, picksBefore := time.Now(), r.metric(picks)
			r.engines[2].sim().SetFaults(sim.Faults{ErrorRate: 0.5, ErrorStatus: 503})
			shed, wasShed := r.events.waitFor(storm, tc.storm, shedEvent(victim))
			if tc.shed && !wasShed {
				t.Fatal("the erroring worker was never shed")
			}
			if wasShed {
				sleepUntil(tc.storm - time.Since(storm))
			}
			stormPicks := int(r.metric(picks) - picksBefore)
			calm := time.Now()
			r.engines[2].sim().SetFaults(sim.Faults{})
			back, ok := r.waitAvailable(victim, calm, 10*time.Second)
			if !ok {
				t.Fatalf("the worker was never readmitted: circuit %s", victim.Breaker.State(time.Now()))
			}
			tl := l.stop()
			tl.wantAllOK(t, "requests")
			if n := r.metric(`kvgate_retries_total{reason="status_service_unavailable"}`); n == 0 {
				t.Error("no retry after a 503 was counted")
			}
			r.settle()
			row := row{drill: "error storm: 50 % 503 from one engine, " + tc.name, requests: tl.requests, failures: tl.failed()}
			if wasShed {
				row.shed, row.recover = shed.at.Sub(storm), back
				row.note = shedNote(shed) + "; " + strconv.Itoa(stormPicks) + " picks of it during the " + tc.storm.String() + " storm; recover = storm ends → circuit closed"
			} else {
				row.note = "not shed during the " + tc.storm.String() + " storm: " + strconv.Itoa(stormPicks) + " picks of it, each 503 retried elsewhere"
			}
			report(row)
		})
	}
}

// TestDrillFlapping turns one engine's every route (health included) to 503 and back every
// 400 ms, under load. Clients see no error; each transition is logged exactly once and counted.
func TestDrillFlapping(t *testing.T) {
	r := newRig(t, defaultRig(3))
	victim := r.workers[1]
	l := r.load(6, 8)
	start := time.Now()
	var lastUp time.Time
	for i := 0; i < 5; i++ {
		r.engines[1].sim().SetFaults(sim.Faults{SlowStart: time.Hour})
		sleepUntil(400 * time.Millisecond)
		lastUp = time.Now()
		r.engines[1].sim().SetFaults(sim.Faults{})
		sleepUntil(400 * time.Millisecond)
	}
	if _, ok := r.waitAvailable(victim, lastUp, 10*time.Second); !ok {
		t.Fatalf("the worker was not readmitted once stable: health %s circuit %s", victim.Health(), victim.Breaker.State(time.Now()))
	}
	var back time.Duration // from the last recovery to readmission, if it was shed in the last flap
	if ev, ok := r.events.waitFor(lastUp, 0, func(ev event) bool {
		return ev.worker == victim.ID && (ev.to == "ready" || ev.to == "closed")
	}); ok {
		back = ev.at.Sub(lastUp)
	}
	tl := l.stop()
	tl.wantAllOK(t, "requests")
	var shedAt time.Duration
	if ev, ok := r.events.waitFor(start, 0, shedEvent(victim)); ok {
		shedAt = ev.at.Sub(start)
	}
	healthLogs, circuitLogs := 0, 0
	for _, to := range []string{"ready", "not_ready"} {
		logged := r.events.count(func(ev event) bool { return ev.worker == victim.ID && ev.kind == "health" && ev.to == to })
		counted := int(r.metric(`kvgate_worker_health_transitions_total{to="` + to + `",worker="` + victim.ID + `"}`))
		if logged != counted {
			t.Errorf("health to %s: %d log lines, %d counted", to, logged, counted)
		}
		healthLogs += logged
	}
	for _, to := range []string{"open", "half_open", "closed"} {
		logged := r.events.count(func(ev event) bool { return ev.worker == victim.ID && ev.kind == "circuit" && ev.to == to })
		counted := int(r.metric(`kvgate_worker_circuit_transitions_total{to="` + to + `",worker="` + victim.ID + `"}`))
		if logged != counted {
			t.Errorf("circuit to %s: %d log lines, %d counted", to, logged, counted)
		}
		circuitLogs += logged
	}
	if healthLogs > 10 {
		t.Errorf("%d health transitions for 5 down periods: each flap logged more than once?", healthLogs)
	}
	for _, w := range []*worker.Worker{r.workers[0], r.workers[2]} {
		if n := r.events.count(func(ev event) bool { return ev.worker == w.ID }); n != 0 {
			t.Errorf("a steady worker logged %d transitions", n)
		}
	}
	r.settle()
	report(row{drill: "flapping engine (503 on every route 400 ms on / 400 ms off, ×5)", requests: tl.requests, failures: tl.failed(),
		shed: shedAt, recover: back,
		note: strconv.Itoa(healthLogs) + " health + " + strconv.Itoa(circuitLogs) + " circuit transitions, each logged once and counted; recover = engine healthy for good → ready"})
}

// TestDrillAllWorkersDown kills every engine: clients get a 503 with a clear message, at once
// and after the workers are marked not ready; once the engines come back the gateway serves
// again without a restart.
func TestDrillAllWorkersDown(t *testing.T) {
	r := newRig(t, defaultRig(2))
	if o := r.do(context.Background(), chatBody(0, 4, false), false, nil); !o.ok {
		t.Fatalf("before the outage: %s", o)
	}
	down := time.Now()
	for _, e := range r.engines {
		e.kill()
	}
	var tl tally
	check := func(phase string) {
		o := r.do(context.Background(), chatBody(1, 4, false), false, nil)
		tl.add(o)
		if o.status != 503 || !o.clear || !strings.Contains(o.message, "no available worker") {
			t.Errorf("%s: %s, want a clear 503", phase, o)
		}
	}
	check("at once")
	var last event
	for _, w := range r.workers {
		ev, ok := r.events.waitFor(down, 5*time.Second, func(ev event) bool { return ev.worker == w.ID && ev.to == "not_ready" })
		if !ok {
			t.Fatal("a dead worker was never marked not ready")
		}
		if ev.at.After(last.at) {
			last = ev
		}
	}
	check("marked down")
	msg := tl.all[len(tl.all)-1].message
	if !strings.Contains(msg, "2 workers, 2 not ready") {
		t.Errorf("the 503 does not say why: %q", msg)
	}
	up := time.Now()
	for _, e := range r.engines {
		e.restart()
	}
	var back time.Duration
	for _, w := range r.workers {
		d, ok := r.waitAvailable(w, up, 5*time.Second)
		if !ok {
			t.Fatal("a restarted worker was never readmitted")
		}
		back = max(back, d)
	}
	o := r.do(context.Background(), chatBody(2, 4, false), false, nil)
	tl.add(o)
	if !o.ok {
		t.Errorf("after recovery: %s", o)
	}
	r.settle()
	report(row{drill: "all workers down, then back", requests: tl.requests, failures: tl.bad,
		shed: last.at.Sub(down), recover: back,
		note: "every request during the outage got a clear 503 (" + strconv.Itoa(tl.clear) + "), e.g. “" + msg + "”; no gateway restart"})
}

// TestDrillClientDisconnect leaves a long stream after its first event: the engine must abort
// the request (it stops running) and the gateway's in-flight count return to zero; a client
// leaving never counts against the worker.
func TestDrillClientDisconnect(t *testing.T) {
	r := newRig(t, defaultRig(2))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan outcome, 1)
	go func() { done <- r.do(ctx, chatBody(0, 5000, true), true, func() { close(started) }) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never started")
	}
	busy := -1
	for i, e := range r.engines {
		if e.running() > 0 {
			busy = i
		}
	}
	if busy < 0 {
		t.Fatal("no engine runs the stream")
	}
	left := time.Now()
	cancel()
	testutil.Recv(t, done, "the abandoned client's return")
	// The engine's abort is visible only in its load; poll it, bounded.
	deadline := time.Now().Add(5 * time.Second)
	for r.engines[busy].running() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the engine still runs the abandoned request")
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen := time.Since(left)
	r.settle()
	w := r.workers[busy]
	if s := w.Breaker.State(time.Now()); s != worker.Closed {
		t.Errorf("circuit %s after a client left", s)
	}
	if n := r.metric(`kvgate_retries_total{reason="canceled"}`); n != 0 {
		t.Errorf("a client cancel was retried %v times", n)
	}
	report(row{drill: "client disconnects mid-stream (5000-token stream)", requests: 1, failures: 0, recover: seen,
		note: "recover = client gone → engine aborted the request (its running count back to 0); circuit stays closed; in-flight 0"})
}

// shedNote names what shed a worker.
func shedNote(ev event) string {
	if ev.kind == "circuit" {
		return "shed by the circuit breaker"
	}
	return "shed by health checks"
}
