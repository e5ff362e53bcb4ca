package drills

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestDrillSIGTERMUnderLoad builds the kvgate binary, serves two engines through it, and sends
// it SIGTERM while streams and completions are running: every one of them must finish whole, a
// new connection must be refused, and the process must exit 0.
func TestDrillSIGTERMUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvgate binary")
	}
	checkGoroutines(t)
	bin := filepath.Join(t.TempDir(), "kvgate")
	bctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(bctx, "go", "build", "-o", bin, "github.com/kvgate/kvgate/cmd/kvgate").CombinedOutput(); err != nil {
		t.Fatalf("building kvgate: %v\n%s", err, out)
	}
	engines := []*engine{startEngine(t, simCfg(1)), startEngine(t, simCfg(2))}
	for _, e := range engines {
		t.Cleanup(e.kill)
	}
	cmd := exec.Command(bin, "serve", "--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0",
		"--worker-urls", engines[0].URL()+","+engines[1].URL(), "--policy", "round_robin",
		"--disable-load-monitor", "--shutdown-grace-period", "20s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addr := make(chan string, 1)
	var logMu sync.Mutex
	var logs strings.Builder
	go func() { // owns stderr until the process closes it
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`api=http://(\S+)`)
		for sc.Scan() {
			logMu.Lock()
			logs.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("kvgate did not start")
	}
	ct := &http.Transport{}
	client := &http.Client{Transport: ct, Timeout: 30 * time.Second}
	t.Cleanup(ct.CloseIdleConnections)

	const n = 8
	var tl tally
	var wg sync.WaitGroup
	for i := 0; i < 2*n; i++ {
		stream := i%2 == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl.add(doChat(context.Background(), client, base, chatBody(i, 150, stream), stream, nil))
		}()
	}
	// Every request must be running on an engine before the signal; the engines' load is the
	// only place that says so.
	deadline := time.Now().Add(10 * time.Second)
	for engines[0].running()+engines[1].running() < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the engines", engines[0].running()+engines[1].running(), 2*n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	drained := time.Since(signalled)
	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("kvgate did not exit after SIGTERM")
	}
	exited <- exitErr // for the cleanup
	stopped := time.Since(signalled)
	if exitErr != nil {
		logMu.Lock()
		t.Errorf("kvgate exited with %v\n%s", exitErr, logs.String())
		logMu.Unlock()
	}
	if tl.ok != tl.requests {
		t.Errorf("%d of %d in-flight requests were cut: %v", tl.requests-tl.ok, tl.requests, tl.failures(5))
	}
	if _, err := client.Get(base + "/health"); err == nil {
		t.Error("kvgate still accepts connections after exiting")
	}
	report(row{drill: "SIGTERM under load (built binary; 8 streams + 8 completions of 150 tokens)", requests: tl.requests,
		failures: tl.requests - tl.ok, shed: drained, recover: stopped,
		note: "shed = SIGTERM → last in-flight request finished whole; recover = SIGTERM → process exited 0"})
}
