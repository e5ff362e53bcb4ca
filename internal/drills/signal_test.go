package drills

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// procRig is the built kvgate binary serving engines that are `kvgate sim` processes, with a
// client for it.
type procRig struct {
	sims   []*simProc
	gw     *kvgate
	client *http.Client
}

// Drill-speed health checks for the process drills: the health bound (the checks that fail after
// an engine stops, each at its timeout, one interval apart) is under a second.
const (
	procHealthInterval  = 100 * time.Millisecond
	procHealthTimeout   = 300 * time.Millisecond
	procHealthFailures  = 2
	procHealthSuccesses = 1
	procHealthBound     = procHealthInterval + procHealthFailures*(procHealthTimeout+procHealthInterval)
)

// newProcRig builds kvgate, starts n engine processes and a gateway process in front of them
// (round robin, drill-speed health checks).
func newProcRig(t *testing.T, n int) *procRig {
	t.Helper()
	checkGoroutines(t)
	bin := buildKvgate(t)
	r := &procRig{}
	var urls []string
	for i := range n {
		s := startSim(t, bin, i+1)
		r.sims = append(r.sims, s)
		urls = append(urls, s.url)
	}
	r.gw = runKvgate(t, bin, "--worker-urls", strings.Join(urls, ","), "--policy", "round_robin", "--disable-load-monitor",
		"--health-check-interval", procHealthInterval.String(), "--health-check-timeout", procHealthTimeout.String(),
		"--health-failure-threshold", "2", "--health-success-threshold", "1")
	ct := &http.Transport{MaxIdleConnsPerHost: 16}
	r.client = &http.Client{Transport: ct, Timeout: 30 * time.Second}
	t.Cleanup(ct.CloseIdleConnections)
	return r
}

// notReadyAt is when the gateway's log says worker url went not ready at or after since, if it
// did.
func (r *procRig) notReadyAt(url string, since time.Time) (time.Time, bool) {
	re := regexp.MustCompile(`time=(\S+) .*msg="worker health changed".*to=not_ready`)
	for _, line := range strings.Split(r.gw.log(), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, strings.TrimPrefix(url, "http://")) {
			continue
		}
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil && !at.Before(since.Truncate(time.Millisecond)) {
			return at, true
		}
	}
	return time.Time{}, false
}

// TestDrillEngineSIGSTOP stops one of two `kvgate sim` processes with SIGSTOP under 10
// non-streamed clients: the kernel still accepts its connections and nothing answers, health
// checks included. The requests caught on it must be sent to the other engine once its checks
// fail: none may wait longer than the health bound plus its own time there, and none may fail.
// Without re-sending, those requests wait until the client gives up (30 s here).
func TestDrillEngineSIGSTOP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	const onOther = 2 * time.Second // generous: a short completion on a loaded machine
	const perClient = 2000          // a bound on the load loop besides its time
	r := newProcRig(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var longest time.Duration
	caught := 0 // requests that took longer than a health interval: the ones held by the stopped engine
	tl := &tally{}
	var wg sync.WaitGroup
	for c := range 10 {
		wg.Go(func() {
			for i := 0; i < perClient && ctx.Err() == nil; i++ {
				start := time.Now()
				tl.add(doChat(context.Background(), r.client, r.gw.base, chatBody(c*100000+i, 8, false), false, nil))
				d := time.Since(start)
				mu.Lock()
				longest = max(longest, d)
				if d > 2*procHealthInterval {
					caught++
				}
				mu.Unlock()
			}
		})
	}
	sleepUntil(300 * time.Millisecond)
	stopped := time.Now()
	r.sims[0].signal(t, syscall.SIGSTOP)
	sleepUntil(procHealthBound + time.Second) // load keeps flowing with the engine gone
	cancel()
	wg.Wait()
	r.sims[0].signal(t, syscall.SIGCONT)
	tl.wantAllOK(t, "completions")
	if longest > procHealthBound+onOther {
		t.Errorf("a request waited %v, past the health bound %v plus %v on the other engine", longest, procHealthBound, onOther)
	}
	if caught == 0 {
		t.Error("no request was held by the stopped engine: the drill tested nothing")
	}
	shed := time.Duration(0)
	if at, ok := r.notReadyAt(r.sims[0].url, stopped); ok {
		shed = at.Sub(stopped)
	} else {
		t.Errorf("the gateway never logged the stopped engine not ready\n%s", r.gw.log())
	}
	report(row{drill: "engine process SIGSTOPped (2 `kvgate sim` processes, 10 clients)", requests: tl.requests,
		failures: tl.failed(), shed: shed,
		note: "longest request " + longest.Round(time.Millisecond).String() + ", health bound " + procHealthBound.String() +
			"; " + strconv.Itoa(caught) + " requests held by the stopped engine and re-sent"})
}

// TestDrillEngineKill9 kills one of three `kvgate sim` processes with SIGKILL while 10 clients
// send 150 non-streamed requests: the attempts reset before their headers on an engine that then
// refuses connections are sent again elsewhere (it did no work a retry could duplicate), so
// none of the 150 fails.
func TestDrillEngineKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	const clients, each = 10, 15
	r := newProcRig(t, 3)
	tl := &tally{}
	progress := make(chan struct{}, clients*each)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				tl.add(doChat(context.Background(), r.client, r.gw.base, chatBody(c*100000+i, 32, false), false, nil))
				progress <- struct{}{}
			}
		})
	}
	for range clients * each / 3 { // a third of the requests done: the rest run across the kill
		<-progress
	}
	killed := time.Now()
	r.sims[0].signal(t, syscall.SIGKILL)
	wg.Wait()
	if tl.ok != tl.requests || tl.requests != clients*each {
		t.Errorf("%d of %d requests failed: %v\n%s", tl.failed(), tl.requests, tl.failures(5), r.gw.logLines("request failed"))
	}
	shed := time.Duration(0)
	if at, ok := r.notReadyAt(r.sims[0].url, killed); ok {
		shed = at.Sub(killed)
	}
	report(row{drill: "engine process kill -9 (3 `kvgate sim` processes, 10 clients, 150 requests)", requests: tl.requests,
		failures: tl.failed(), shed: shed, note: "a third of the requests done before the kill"})
}
