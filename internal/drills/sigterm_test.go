package drills

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// kvgate is a kvgate binary running as a child process.
type kvgate struct {
	cmd    *exec.Cmd
	base   string     // the API's base URL
	exited chan error // receives the process's exit once
	logMu  sync.Mutex
	logs   strings.Builder
}

// startKvgate builds the kvgate binary and runs `kvgate serve args…` on a free port, returning
// once it listens. A cleanup kills it if the test has not ended it.
func startKvgate(t *testing.T, args ...string) *kvgate {
	t.Helper()
	return runKvgate(t, buildKvgate(t), args...)
}

// runKvgate runs `bin serve args…` on a free port, returning once it listens. A cleanup kills it
// if the test has not ended it.
func runKvgate(t *testing.T, bin string, args ...string) *kvgate {
	t.Helper()
	k := &kvgate{cmd: exec.Command(bin, append([]string{"serve", "--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "-1"}, args...)...),
		exited: make(chan error, 1)}
	stderr, err := k.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	re := regexp.MustCompile(`api=http://(\S+)`)
	scanLines(t, k.cmd, stderr, func(line string) {
		k.logMu.Lock()
		k.logs.WriteString(line + "\n")
		k.logMu.Unlock()
		if m := re.FindStringSubmatch(line); m != nil {
			addr <- m[1]
		}
	}, k.exited)
	t.Cleanup(func() {
		_ = k.cmd.Process.Kill()
		testutil.Recv(t, k.exited, "the killed gateway's exit")
	})
	select {
	case a := <-addr:
		k.base = "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("kvgate did not start")
	}
	return k
}

// wait returns the process's exit, failing after bound.
func (k *kvgate) wait(t *testing.T, bound time.Duration) error {
	t.Helper()
	select {
	case err := <-k.exited:
		k.exited <- err // for the cleanup
		return err
	case <-time.After(bound):
		t.Fatal("kvgate did not exit")
		return nil
	}
}

func (k *kvgate) log() string {
	k.logMu.Lock()
	defer k.logMu.Unlock()
	return k.logs.String()
}

// logLines returns the log's lines that contain sub: what a failed drill prints of the log.
func (k *kvgate) logLines(sub string) string {
	var b strings.Builder
	for line := range strings.Lines(k.log()) {
		if strings.Contains(line, sub) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// sigtermRun is what a SIGTERM drill observed.
type sigtermRun struct {
	engines []*engine
	tl      *tally
	client  *http.Client
	base    string
	// ended is SIGTERM → the last client request ended; stopped is SIGTERM → the process exited.
	ended, stopped time.Duration
}

// sigtermUnderLoad builds and starts kvgate over two engines with the given grace period, starts
// n streams and n completions of tokens output tokens each, waits until every one runs on an
// engine, sends SIGTERM, and waits for the requests and then the process (which must exit 0).
func sigtermUnderLoad(t *testing.T, grace time.Duration, n, tokens int) *sigtermRun {
	t.Helper()
	checkGoroutines(t)
	r := &sigtermRun{engines: []*engine{startEngine(t, simCfg(1)), startEngine(t, simCfg(2))}, tl: &tally{}}
	for _, e := range r.engines {
		t.Cleanup(e.kill)
	}
	k := startKvgate(t, "--worker-urls", r.engines[0].URL()+","+r.engines[1].URL(), "--policy", "round_robin",
		"--disable-load-monitor", "--shutdown-grace-period", grace.String())
	r.base = k.base
	ct := &http.Transport{}
	r.client = &http.Client{Transport: ct, Timeout: 30 * time.Second}
	t.Cleanup(ct.CloseIdleConnections)

	var wg sync.WaitGroup
	for i := 0; i < 2*n; i++ {
		stream := i%2 == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.tl.add(doChat(context.Background(), r.client, k.base, chatBody(i, tokens, stream), stream, nil))
		}()
	}
	// Every request must be running on an engine before the signal; the engines' load is the
	// only place that says so.
	running := func() int { return r.engines[0].running() + r.engines[1].running() }
	deadline := time.Now().Add(10 * time.Second)
	for running() < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the engines", running(), 2*n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	signalled := time.Now()
	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	r.ended = time.Since(signalled)
	if err := k.wait(t, 30*time.Second); err != nil {
		t.Errorf("kvgate exited with %v\n%s", err, k.log())
	}
	r.stopped = time.Since(signalled)
	return r
}

// TestDrillSIGTERMUnderLoad builds the kvgate binary, serves two engines through it, and sends
// it SIGTERM while streams and completions are running: every one of them must finish whole, a
// new connection must be refused, and the process must exit 0.
func TestDrillSIGTERMUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	r := sigtermUnderLoad(t, 20*time.Second, 8, 150)
	tl := r.tl
	if tl.ok != tl.requests {
		t.Errorf("%d of %d in-flight requests were cut: %v", tl.failed(), tl.requests, tl.failures(5))
	}
	if _, err := r.client.Get(r.base + "/health"); err == nil {
		t.Error("kvgate still accepts connections after exiting")
	}
	report(row{drill: "SIGTERM under load (built binary; 8 streams + 8 completions of 150 tokens)", requests: tl.requests,
		failures: tl.failed(), shed: r.ended, recover: r.stopped,
		note: "shed = SIGTERM → last in-flight request finished whole; recover = SIGTERM → process exited 0"})
}

// TestDrillSIGTERMGraceExpires sends SIGTERM while requests that outlast the grace period run:
// when it ends, each of them must get a clear error (an SSE error event and [DONE] for streams,
// a 503 for completions) rather than a cut connection, the engines must see the cancel, and the
// process must exit 0.
func TestDrillSIGTERMGraceExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	const grace = 300 * time.Millisecond
	r := sigtermUnderLoad(t, grace, 4, 3000)
	tl, engines, ended, stopped := r.tl, r.engines, r.ended, r.stopped
	for _, o := range tl.all {
		want := 503
		if o.stream {
			want = 200 // the status line went out long ago; the error is an event
		}
		if !o.clear || o.status != want || !strings.Contains(o.message, "shutting down") {
			t.Errorf("stream=%v: %s; want a clear shutting-down error with status %d", o.stream, o, want)
		}
	}
	for i, e := range engines {
		deadline := time.Now().Add(5 * time.Second)
		for e.running() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("engine %d still runs %d requests the gateway ended", i, e.running())
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if ended < grace {
		t.Errorf("requests ended %v after SIGTERM, before the %v grace period", ended, grace)
	}
	report(row{drill: "SIGTERM, grace period (300 ms) shorter than the requests (4 streams + 4 completions of 3000 tokens)", requests: tl.requests,
		failures: tl.bad, shed: ended, recover: stopped,
		note: "at the end of the grace period every request got a clear error (SSE error event + [DONE], or 503) and the engines saw the cancel; shed = SIGTERM → last request ended; recover = SIGTERM → exit 0"})
}
