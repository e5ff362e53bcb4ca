//go:build unix

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// BenchmarkProxyCost tells proxies apart by what they cost per request: kvgate (its real handler:
// parsing, the default cache_aware_hash policy, metrics, the proxy) and a minimal
// httputil.ReverseProxy, each in a child process of its own so that its CPU time (getrusage,
// read between rounds) is its own, in front of one zero-work upstream on loopback. A client sends
// requests one at a time (c=1) and times them; the same requests go straight to the upstream for
// the added latency. Each b.N iteration is one round of every path, in an order that alternates,
// so that a shared machine's noise falls on all of them alike; the ratios are kvgate over
// ReverseProxy from the same rounds.
//
//	go test -run XXX -bench ProxyCost -benchtime 20x -count 3 ./internal/gateway/
//
// To compare two versions of kvgate in the same rounds, build the older test binary (go test -c
// -o old.test) and name it in KVGATE_PROXYCOST_BASELINE: its kvgate child runs as a fourth path,
// and base-cpu-us/req and vs-base-ratio (this kvgate's CPU over the older one's) are reported.
func BenchmarkProxyCost(b *testing.B) {
	for _, c := range []struct {
		name   string
		size   int
		stream bool
		per    int // requests per path per round
	}{
		{"1KB", 1_000, false, 400},
		{"100KB", 100_000, false, 100},
		{"1MB", 1_000_000, false, 20},
		{"SSE10", 1_000, true, 200},
	} {
		// One upstream and one child of each proxy per case, kept across the framework's calls
		// of the sub-benchmark with growing b.N.
		up := httptest.NewServer(http.HandlerFunc(zeroWork))
		kv := startProxyChild(b, "", "kvgate", c.name, up.URL)
		rp := startProxyChild(b, "", "reverseproxy", c.name, up.URL)
		var base *proxyChild
		if exe := os.Getenv(proxyCostEnv + "_BASELINE"); exe != "" {
			base = startProxyChild(b, exe, "kvgate", c.name, up.URL)
		}
		b.Run(c.name, func(b *testing.B) { benchProxyCost(b, up.URL, kv, rp, base, proxyCostBody(c.size, c.stream), c.per) })
		stopProxyChild(kv)
		stopProxyChild(rp)
		if base != nil {
			stopProxyChild(base)
		}
		up.Close()
	}
}

// proxyCostBody returns a chat request of size bytes whose user message is prose with a newline
// escape every 80 bytes or so.
func proxyCostBody(size int, stream bool) []byte {
	head := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`, stream)
	tail := `"}]}`
	line := `lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor\n`
	fill := strings.Repeat(line, (size-len(head)-len(tail))/len(line)+1)[:size-len(head)-len(tail)]
	fill = strings.TrimRight(fill, `\`) // never cut an escape in half
	return []byte(head + fill + strings.Repeat(" ", size-len(head)-len(tail)-len(fill)) + tail)
}

// zeroWork answers at once: a short completion, or ten SSE events flushed one by one.
func zeroWork(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`)
		return
	}
	var head [512]byte
	n, _ := io.ReadFull(r.Body, head[:])
	io.Copy(io.Discard, r.Body)
	if !bytes.Contains(head[:n], []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 10 {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token%d\"},\"finish_reason\":null}]}\n\n", i)
		fl.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

const (
	proxyCostEnv = "KVGATE_PROXYCOST_CHILD" // "kvgate" or "reverseproxy"
	cpuPath      = "/__proxycost_cpu"
)

// TestProxyCostChild is not a test: BenchmarkProxyCost runs the test binary again with
// proxyCostEnv set, and this serves the chosen proxy until its stdin closes.
func TestProxyCostChild(t *testing.T) {
	kind := os.Getenv(proxyCostEnv)
	if kind == "" {
		t.Skip("run by BenchmarkProxyCost only")
	}
	upstream, err := url.Parse(os.Getenv(proxyCostEnv + "_UPSTREAM"))
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	switch kind {
	case "kvgate":
		router, err := policy.NewRouter("cache_aware_hash", policy.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer router.Close()
		s := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, worker.NewRegistry(), router, nil)
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: upstream.String()}); err != nil {
			t.Fatal(err)
		}
		h = s.Handler()
	case "reverseproxy":
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		h = &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(upstream); pr.SetXForwarded() },
			FlushInterval: -1,
			Transport:     tr,
		}
	default:
		t.Fatalf("unknown proxy %q", kind)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == cpuPath {
			fmt.Fprint(w, cpuMicros())
			return
		}
		h.ServeHTTP(w, r)
	})}
	if dir := os.Getenv(proxyCostEnv + "_PROFILE"); dir != "" {
		// A CPU profile of the whole run, to see where a proxy spends: set the variable to a
		// directory when running the benchmark.
		f, err := os.Create(filepath.Join(dir, kind+"-"+os.Getenv(proxyCostEnv+"_CASE")+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String())
	io.Copy(io.Discard, os.Stdin) // until the benchmark closes it
	srv.Close()
}

// cpuMicros returns the process's user plus system CPU time in microseconds.
func cpuMicros() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano()/1e3 + ru.Stime.Nano()/1e3
}

// proxyChild is a proxy running in a child process.
type proxyChild struct {
	url   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startProxyChild runs the test binary exe (empty: this one) as a child serving kind.
func startProxyChild(b *testing.B, exe, kind, name, upstream string) *proxyChild {
	b.Helper()
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			b.Fatal(err)
		}
	}
	cmd := exec.Command(exe, "-test.run=^TestProxyCostChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), proxyCostEnv+"="+kind, proxyCostEnv+"_UPSTREAM="+upstream, proxyCostEnv+"_CASE="+name)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &proxyChild{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("%s child: %v", kind, err)
	}
	p.url = "http://" + strings.TrimSpace(line)
	return p
}

// stopProxyChild closes the child's stdin, on which it exits, and waits for it.
func stopProxyChild(p *proxyChild) {
	p.stdin.Close()
	p.cmd.Wait()
}

// cpu asks the child for its CPU time so far.
func (p *proxyChild) cpu(b *testing.B, c *http.Client) time.Duration {
	resp, err := c.Get(p.url + cpuPath)
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	us, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || us < 0 {
		b.Fatalf("cpu time %q: %v", raw, err)
	}
	return time.Duration(us) * time.Microsecond
}

func benchProxyCost(b *testing.B, upstream string, kv, rp, base *proxyChild, body []byte, per int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	type path struct {
		url   string
		child *proxyChild
		cpu   time.Duration
		n     int
		lat   []time.Duration
		fails int
	}
	paths := []*path{{url: kv.url, child: kv}, {url: rp.url, child: rp}, {url: upstream}}
	if base != nil {
		paths = append(paths, &path{url: base.url, child: base})
	}
	send := func(p *path, n int) {
		for range n {
			t0 := time.Now()
			resp, err := client.Post(p.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("%s: status %d", p.url, resp.StatusCode)
			}
			if err != nil { // a relay cut short: counted, and left out of the latencies
				p.fails++
				continue
			}
			p.lat = append(p.lat, time.Since(t0))
		}
	}
	for _, p := range paths { // warm connections, pools and the prefix tree
		send(p, min(per, 50))
		p.lat = p.lat[:0]
	}
	round := 0
	for b.Loop() {
		order := slices.Clone(paths)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		round++
		for _, p := range order {
			var c0 time.Duration
			if p.child != nil {
				c0 = p.child.cpu(b, client)
			}
			send(p, per)
			if p.child != nil {
				p.cpu += p.child.cpu(b, client) - c0
				p.n += per
			}
		}
	}
	b.StopTimer()
	kvp, rpp, direct := paths[0], paths[1], paths[2]
	cpuPer := func(p *path) float64 { return float64(p.cpu.Microseconds()) / float64(p.n) }
	b.ReportMetric(cpuPer(kvp), "kvgate-cpu-us/req")
	b.ReportMetric(cpuPer(rpp), "rp-cpu-us/req")
	b.ReportMetric(cpuPer(kvp)/cpuPer(rpp), "cpu-ratio")
	if base != nil {
		b.ReportMetric(cpuPer(paths[3]), "base-cpu-us/req")
		b.ReportMetric(cpuPer(kvp)/cpuPer(paths[3]), "vs-base-ratio")
	}
	d50, d99 := pct(direct.lat, 50), pct(direct.lat, 99)
	for _, p := range []struct {
		name string
		lat  []time.Duration
	}{{"kvgate", kvp.lat}, {"rp", rpp.lat}} {
		b.ReportMetric(float64((pct(p.lat, 50) - d50).Microseconds()), p.name+"-added-p50-us")
		b.ReportMetric(float64((pct(p.lat, 99) - d99).Microseconds()), p.name+"-added-p99-us")
	}
	b.ReportMetric(float64(d50.Microseconds()), "direct-p50-us")
	if kvp.fails+rpp.fails+direct.fails > 0 {
		b.ReportMetric(float64(kvp.fails), "kvgate-cut-short")
		b.ReportMetric(float64(rpp.fails), "rp-cut-short")
		b.ReportMetric(float64(direct.fails), "direct-cut-short")
	}
}
