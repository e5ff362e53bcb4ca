package loadmon

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// The poll-cost measurement (the budget: polling 1000 workers every second must cost < 5 % of one
// core). It runs only when asked, because it takes ~20 s and ~2000 file descriptors:
//
//	KVGATE_LOADMON_COST=1000 go test -run '^TestPollCost$' -v ./internal/loadmon/
//
// The simulated workers live in a child process (this test binary re-executed as
// TestHelperFleet), so getrusage(RUSAGE_SELF) in this process counts only the monitor: the HTTP
// client, reading, parsing, snapshot building, GC. Half the workers are SGLang-like (native
// /v1/loads), half vLLM-like (a /metrics body of realistic size, histograms included).

const (
	costEnv   = "KVGATE_LOADMON_COST"
	helperEnv = "KVGATE_LOADMON_FLEET"
	// costStockEnv=0 measures the default client only (no stock net/http windows), for
	// comparing two builds of the monitor run one after the other.
	costStockEnv = "KVGATE_LOADMON_COST_STOCK"
	// costGzipEnv=1 makes the simulated /metrics gzip its page when the poll accepts gzip, as
	// prometheus_client's ASGI app does (SGLang, older vLLM); the default answers plain text.
	costGzipEnv = "KVGATE_LOADMON_COST_GZIP"
	// costWindowEnv sets each measuring window (a Go duration); the default is 7s.
	costWindowEnv = "KVGATE_LOADMON_COST_WINDOW"
)

// costWindow returns the length of one measuring window.
func costWindow(t *testing.T) time.Duration {
	s := os.Getenv(costWindowEnv)
	if s == "" {
		return 7 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 3*time.Second || d > 5*time.Minute {
		t.Fatalf("%s=%q: want a duration in [3s, 5m]", costWindowEnv, s)
	}
	return d
}

// vllmRealisticMetrics is vllmMetrics padded with histogram series to the size of a real vLLM
// /metrics page (tens of KB); the parser must skip them.
var vllmRealisticMetrics = func() string {
	var b strings.Builder
	b.WriteString(vllmMetrics)
	for _, h := range []string{"time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
		"request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
		"request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total"} {
		fmt.Fprintf(&b, "# HELP vllm:%s Histogram.\n# TYPE vllm:%s histogram\n", h, h)
		for i := range 24 {
			fmt.Fprintf(&b, "vllm:%s_bucket{engine=\"0\",le=\"%g\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d.0\n", h, 0.001*float64(int(1)<<i), i*37)
		}
		fmt.Fprintf(&b, "vllm:%s_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 888.0\n", h)
		fmt.Fprintf(&b, "vllm:%s_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 123.4\n", h)
	}
	return b.String()
}()

// TestHelperFleet is not a test: re-executed with KVGATE_LOADMON_FLEET=n it serves n simulated
// workers on loopback, prints their addresses, and exits when its stdin closes (so it cannot
// outlive the measuring process).
func TestHelperFleet(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(helperEnv))
	if n <= 0 {
		t.Skip("helper process for TestPollCost")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/loads", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, busyLoads) })
	metrics := func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, vllmRealisticMetrics) }
	if os.Getenv(costGzipEnv) == "1" {
		// As SGLang's and older vLLM's /metrics (prometheus_client's ASGI app) answer: gzip
		// when the request accepts it. Compressed once: the workers' CPU is not measured.
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		io.WriteString(zw, vllmRealisticMetrics)
		zw.Close()
		metrics = func(w http.ResponseWriter, r *http.Request) {
			if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				io.WriteString(w, vllmRealisticMetrics)
				return
			}
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gz.Bytes())
		}
	}
	mux.HandleFunc("/metrics", metrics)
	out := bufio.NewWriter(os.Stdout)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go http.Serve(ln, mux) // ends with the process
		fmt.Fprintln(out, "ADDR", ln.Addr())
	}
	fmt.Fprintln(out, "READY")
	out.Flush()
	io.Copy(io.Discard, os.Stdin)
}

// costRuntime returns the runtime of the i-th measured worker: KVGATE_LOADMON_COST_MIX=loads
// makes all of them native /v1/loads, =metrics all vLLM /metrics; the default alternates.
func costRuntime(i int) string {
	switch os.Getenv("KVGATE_LOADMON_COST_MIX") {
	case "loads":
		return RuntimeSGLang
	case "metrics":
		return RuntimeVLLM
	}
	if i%2 == 1 {
		return RuntimeVLLM
	}
	return RuntimeSGLang
}

// cpuTime returns this process's user+system CPU time.
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestPollCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(costEnv))
	if n <= 0 {
		t.Skipf("set %s=<workers> to measure the poll cost", costEnv)
	}
	reg := startFleet(t, n)

	var vllm int
	for i := range n {
		if costRuntime(i) == RuntimeVLLM {
			vllm++
		}
	}
	t.Logf("%d workers (%d native /v1/loads of %d B, %d vLLM /metrics of %d B), interval 1s, concurrency 64",
		n, n-vllm, len(busyLoads), vllm, len(vllmRealisticMetrics))
	// The default (NewTransport, tuned) and a stock net/http transport side by side, twice each,
	// interleaved, so that the machine's background load hits both alike.
	stock := http.DefaultTransport.(*http.Transport).Clone()
	defer stock.CloseIdleConnections()
	clients := []struct {
		name   string
		client http.RoundTripper
	}{{"NewTransport (default)", nil}, {"stock net/http", stock}}
	if os.Getenv(costStockEnv) == "0" {
		clients = clients[:1] // comparing builds: the stock client's windows would only cost time
	}
	window := costWindow(t)
	share := make([]float64, len(clients))
	for rep := range 2 {
		for i, c := range clients {
			s := measurePolling(t, reg, c.client, window)
			share[i] += s / 2
			t.Logf("  %-22s window %d: %.2f%% of one core", c.name, rep, 100*s)
		}
	}
	for i, c := range clients {
		t.Logf("%-22s %.2f%% of one core = %.1f µs CPU per poll", c.name, 100*share[i], share[i]/float64(n)*1e6)
	}
	if len(clients) == 2 {
		t.Logf("default / stock CPU ratio: %.2f", share[0]/share[1])
	}
	if share[0] > 0.05 {
		t.Errorf("polling costs %.2f%% of one core, budget 5%%", 100*share[0])
	}
}

// measurePolling runs a monitor of reg with client (nil: the default) for window after two
// warm-up rounds and returns its CPU time per wall second. Every published round must hold an
// entry for every worker.
func measurePolling(t *testing.T, reg *worker.Registry, client http.RoundTripper, window time.Duration) float64 {
	n := len(reg.View().All)
	m := New(reg, Config{Transport: client, Logger: slog.New(slog.DiscardHandler)})
	defer m.Stop()
	ctx := t.Context()
	m.PollOnce(ctx) // warm-up rounds: dial every worker
	m.PollOnce(ctx)
	m.Start(ctx)
	wall0, cpu0 := time.Now(), cpuTime(t)
	rounds, lastAt := 0, time.Time{}
	for deadline := wall0.Add(window); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // sampling the published snapshots over a fixed window
		if s := m.Snapshot(); !s.At.Equal(lastAt) {
			lastAt = s.At
			rounds++
			if s.Len() != n {
				t.Errorf("round at %v has %d entries, want %d", s.At, s.Len(), n)
			}
		}
	}
	cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
	if min := int(window/time.Second) - 1; rounds < min {
		t.Errorf("%d rounds in %v, want at least %d", rounds, wall, min)
	}
	return cpu.Seconds() / wall.Seconds()
}

// startFleet starts the simulated workers' child process (TestHelperFleet) and returns a registry
// of its n workers, ready; the child exits when tb's test ends.
func startFleet(tb testing.TB, n int) *worker.Registry {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFleet$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", helperEnv, n), costEnv+"=")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close() // the helper exits on EOF
		cmd.Wait()
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		tb.Logf("simulated workers' process used %.2fs CPU in all (not counted above)",
			time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Seconds())
	})

	reg := worker.NewRegistry()
	sc := bufio.NewScanner(stdout)
	for i := 0; sc.Scan() && sc.Text() != "READY"; {
		addr, ok := strings.CutPrefix(sc.Text(), "ADDR ")
		if !ok {
			continue
		}
		w, err := worker.New(worker.Spec{URL: "http://" + addr, Runtime: costRuntime(i)}, worker.BreakerConfig{})
		if err != nil {
			tb.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		if err := reg.Add(w); err != nil {
			tb.Fatal(err)
		}
		i++
	}
	if got := len(reg.View().All); got != n {
		tb.Fatalf("helper served %d workers, want %d", got, n)
	}
	return reg
}

// BenchmarkPollFleet polls rounds back to back over the out-of-process simulated workers
// (KVGATE_LOADMON_COST=n of them, default 200), so that a CPU profile of the monitor has many
// samples; cpu-µs/poll is this process's CPU per worker polled (the workers' CPU excluded).
//
//	KVGATE_LOADMON_COST=1000 go test -run XXX -bench PollFleet -benchtime 20x -cpuprofile /tmp/poll.prof ./internal/loadmon/
func BenchmarkPollFleet(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv(costEnv))
	if n <= 0 {
		n = 200
	}
	reg := startFleet(b, n)
	m := New(reg, Config{Logger: slog.New(slog.DiscardHandler)})
	b.Cleanup(m.Stop)
	m.PollOnce(b.Context()) // dial every worker
	m.PollOnce(b.Context())
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		m.PollOnce(b.Context())
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N*n), "cpu-µs/poll")
	if got := m.Snapshot().Len(); got != n {
		b.Fatalf("%d entries, want %d", got, n)
	}
}

// BenchmarkPollOnce measures one round over in-process loopback workers (the servers' CPU is
// included here, so the figure is an upper bound; TestPollCost separates them).
func BenchmarkPollOnce(b *testing.B) {
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			reg := worker.NewRegistry()
			mux := http.NewServeMux()
			mux.HandleFunc("/v1/loads", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, busyLoads) })
			mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, vllmRealisticMetrics) })
			for i := range n {
				srv := httptest.NewServer(mux)
				b.Cleanup(srv.Close)
				rt := RuntimeSGLang
				if i%2 == 1 {
					rt = RuntimeVLLM
				}
				w, err := worker.New(worker.Spec{URL: srv.URL, Runtime: rt}, worker.BreakerConfig{})
				if err != nil {
					b.Fatal(err)
				}
				w.SetHealth(worker.Ready)
				if err := reg.Add(w); err != nil {
					b.Fatal(err)
				}
			}
			m := New(reg, Config{Logger: slog.New(slog.DiscardHandler)})
			b.Cleanup(m.Stop)
			m.PollOnce(b.Context())
			b.ReportAllocs()
			for b.Loop() {
				m.PollOnce(b.Context())
			}
			if m.Snapshot().Len() != n {
				b.Fatalf("%d entries, want %d", m.Snapshot().Len(), n)
			}
		})
	}
}

func BenchmarkParsePrometheusRealistic(b *testing.B) {
	body := []byte(vllmRealisticMetrics)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParsePrometheus(body, RuntimeVLLM); err != nil {
			b.Fatal(err)
		}
	}
}
