//go:build unix

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
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
// httputil.ReverseProxy, each in child processes of its own so that their CPU time (getrusage,
// read around each path's share of a round) is their own, in front of one zero-work upstream on
// loopback. A client sends requests one at a time (c=1) and times them; the same requests go
// straight to the upstream for the added latency. Each b.N iteration is one round of every path,
// in an order that alternates, so that a shared machine's noise falls on all of them alike.
//
// Each proxy runs as several children (KVGATE_PROXYCOST_CHILDREN, default 3), started once per
// case; a path's requests of a round go to its children in one block each, so that every child
// sees the same rounds. One child process keeps a bias of its own for its whole life (up to
// ±0.2 in the ratio), which more children average out: cpu-ratio is kvgate's CPU summed over its
// children over its requests summed, over the same for ReverseProxy, and cpu-ratio-min and
// cpu-ratio-max are the lowest and highest ratio of one kvgate child to one ReverseProxy child,
// the spread that runs with one child per proxy would have shown.
//
//	go test -run XXX -bench ProxyCost -benchtime 20x -count 3 ./internal/gateway/
//
// To compare two versions of kvgate in the same rounds, build the older test binary (go test -c
// -o old.test) and name it in KVGATE_PROXYCOST_CHILD_BASELINE: its kvgate children run as a
// fourth path, and base-cpu-us/req and vs-base-ratio (this kvgate's CPU over the older one's,
// with vs-base-ratio-min and -max) are reported.
func BenchmarkProxyCost(b *testing.B) {
	children := proxyCostChildren(b)
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
		var kv, rp, base []*proxyChild
		b.Run(c.name, func(b *testing.B) {
			// One upstream and the children of each proxy per case, started only for the
			// cases that run; a benchmark using b.Loop is called once, and b.Loop starts the
			// timer after this.
			up := httptest.NewServer(http.HandlerFunc(zeroWork))
			b.Cleanup(up.Close) // after the children's, which run first
			kv = startProxyChildren(b, children, "", "kvgate", c.name, up.URL)
			rp = startProxyChildren(b, children, "", "reverseproxy", c.name, up.URL)
			if exe := os.Getenv(proxyCostEnv + "_BASELINE"); exe != "" {
				base = startProxyChildren(b, children, exe, "kvgate", c.name+"-base", up.URL)
			}
			benchProxyCost(b, up.URL, kv, rp, base, proxyCostBody(c.size, c.stream), c.per)
		})
		// Only now, the case's result line printed, what the children wrote to stderr.
		for _, p := range slices.Concat(kv, rp, base) {
			p.printLog()
		}
	}
}

// proxyCostChildren returns how many children each proxy runs as: KVGATE_PROXYCOST_CHILDREN,
// from 1 to 8 (so that even the 1 MB case's 20 requests a round reach every child), default 3.
func proxyCostChildren(b *testing.B) int {
	v := os.Getenv("KVGATE_PROXYCOST_CHILDREN")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 8 {
		b.Fatalf("KVGATE_PROXYCOST_CHILDREN=%q: want a whole number from 1 to 8", v)
	}
	return n
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
		router := newRouter(t, "cache_aware_hash", policy.DefaultConfig())
		s := New(Config{Logger: slog.New(slog.DiscardHandler)}, worker.NewRegistry(), router, nil)
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
		// directory when running the benchmark. The case's name carries the child's index
		// (kvgate-1KB-0.pprof, reverseproxy-1KB-2.pprof, kvgate-1KB-base-1.pprof), so that
		// each child writes a file of its own, older baselines' children included.
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
	name  string // kind, case and index, for its log
	url   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   childLog
}

// startProxyChildren runs n children serving kind, one after the other; see startProxyChild.
func startProxyChildren(b *testing.B, n int, exe, kind, name, upstream string) []*proxyChild {
	b.Helper()
	cs := make([]*proxyChild, n)
	for i := range cs {
		cs[i] = startProxyChild(b, exe, kind, name+"-"+strconv.Itoa(i), upstream)
		b.Cleanup(func() { stopProxyChild(cs[i]) })
	}
	return cs
}

// startProxyChild runs the test binary exe (empty: this one) as a child serving kind; name (the
// case and the child's index) names its CPU profile.
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
	p := &proxyChild{name: kind + "-" + name, cmd: cmd}
	cmd.Stderr = &p.log
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p.stdin = stdin
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stopProxyChild(p)
		b.Fatalf("%s child: %v; its stderr:\n%s", p.name, err, p.log.buf)
	}
	p.url = "http://" + strings.TrimSpace(line)
	return p
}

// stopProxyChild closes the child's stdin, on which it exits, and waits for it.
func stopProxyChild(p *proxyChild) {
	p.stdin.Close()
	p.cmd.Wait()
}

// printLog prints what the stopped child wrote to stderr, if anything.
func (p *proxyChild) printLog() {
	if len(p.log.buf) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "%s child's stderr:\n%s", p.name, p.log.buf)
	if p.log.dropped > 0 {
		fmt.Fprintf(os.Stderr, "... and %d bytes more\n", p.log.dropped)
	}
}

// childLog keeps the first 8 KB a child writes to stderr, printed after its case so that its
// log lines (ReverseProxy's on relays cut short) cannot break the benchmark's result lines.
// Only the exec package's copying goroutine writes it, and cmd.Wait waits for that goroutine.
type childLog struct {
	buf     []byte
	dropped int
}

func (l *childLog) Write(p []byte) (int, error) {
	n := min(len(p), 8<<10-len(l.buf))
	l.buf = append(l.buf, p[:n]...)
	l.dropped += len(p) - n
	return len(p), nil
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

// costPath is one way to the upstream: through a proxy's children, or straight (no children).
type costPath struct {
	url      string // the upstream, when there are no children
	children []*proxyChild
	cpu      []time.Duration // per child, over the rounds
	n        []int           // requests per child, over the rounds
	next     int             // the child that serves first in the next round
	lat      []time.Duration
	fails    int
}

func newCostPath(url string, children []*proxyChild) *costPath {
	return &costPath{url: url, children: children, cpu: make([]time.Duration, len(children)), n: make([]int, len(children))}
}

// round sends the path's n requests of one round: straight, or in one block per child, each
// child's CPU time read around its block. A block's requests come back to back, as they would
// to a single child: spread one by one over the children, each child would sleep between its
// requests and pay for waking up on each (measured: both proxies' CPU per request 1.3–1.9×
// at 1 KB, 100 KB and for SSE, and the ratio pulled towards 1). The first child changes each
// round, so that over the rounds every child serves at every place in the order.
func (p *costPath) round(b *testing.B, client *http.Client, body []byte, n int) {
	k := len(p.children)
	if k == 0 {
		p.send(b, client, p.url, body, n)
		return
	}
	for j := range k {
		i := (p.next + j) % k
		share := n / k
		if j < n%k {
			share++
		}
		c := p.children[i]
		c0 := c.cpu(b, client)
		p.send(b, client, c.url, body, share)
		p.cpu[i] += c.cpu(b, client) - c0
		p.n[i] += share
	}
	p.next = (p.next + 1) % k
}

// send sends n requests to url, one at a time, timing each.
func (p *costPath) send(b *testing.B, client *http.Client, url string, body []byte, n int) {
	for range n {
		t0 := time.Now()
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: status %d", url, resp.StatusCode)
		}
		if err != nil { // a relay cut short: counted, and left out of the latencies
			p.fails++
			continue
		}
		p.lat = append(p.lat, time.Since(t0))
	}
}

// cpuPerReq returns the path's CPU per request in µs: its children's CPU summed over their
// requests summed.
func (p *costPath) cpuPerReq() float64 {
	var cpu time.Duration
	var n int
	for i := range p.children {
		cpu += p.cpu[i]
		n += p.n[i]
	}
	return float64(cpu.Microseconds()) / float64(n)
}

// childCPUPerReq returns the lowest and highest CPU per request in µs of one of the path's
// children.
func (p *costPath) childCPUPerReq() (lo, hi float64) {
	lo, hi = math.Inf(1), 0
	for i := range p.children {
		c := float64(p.cpu[i].Microseconds()) / float64(p.n[i])
		lo, hi = min(lo, c), max(hi, c)
	}
	return lo, hi
}

// reportRatio reports a's CPU per request over b's as name, and the lowest and highest ratio of
// one of a's children to one of b's as name-min and name-max.
func reportRatio(bm *testing.B, name string, a, b *costPath) {
	bm.ReportMetric(a.cpuPerReq()/b.cpuPerReq(), name)
	alo, ahi := a.childCPUPerReq()
	blo, bhi := b.childCPUPerReq()
	bm.ReportMetric(alo/bhi, name+"-min")
	bm.ReportMetric(ahi/blo, name+"-max")
}

func benchProxyCost(b *testing.B, upstream string, kv, rp, base []*proxyChild, body []byte, per int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	kvp, rpp, direct := newCostPath("", kv), newCostPath("", rp), newCostPath(upstream, nil)
	paths := []*costPath{kvp, rpp, direct}
	if base != nil {
		paths = append(paths, newCostPath("", base))
	}
	for _, p := range paths { // warm connections, pools and the prefix tree, in every child
		if len(p.children) == 0 {
			p.send(b, client, p.url, body, min(per, 50))
		}
		for _, c := range p.children {
			p.send(b, client, c.url, body, min(per, 50))
		}
		p.lat, p.fails = p.lat[:0], 0
	}
	round := 0
	for b.Loop() {
		order := slices.Clone(paths)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		round++
		for _, p := range order {
			p.round(b, client, body, per)
		}
	}
	b.StopTimer()
	b.ReportMetric(kvp.cpuPerReq(), "kvgate-cpu-us/req")
	b.ReportMetric(rpp.cpuPerReq(), "rp-cpu-us/req")
	reportRatio(b, "cpu-ratio", kvp, rpp)
	if base != nil {
		b.ReportMetric(paths[3].cpuPerReq(), "base-cpu-us/req")
		reportRatio(b, "vs-base-ratio", kvp, paths[3])
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
