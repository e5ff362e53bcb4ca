package gateway

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The hostile-client suite: connections that try to tie up or exhaust the gateway, held open all
// at once while ordinary clients are served, with the gateway's heap measured. Each kind is one
// way a client can make an HTTP server hold memory or a goroutine without finishing a request.

// hostileKinds send the opening of a request (or nothing) and then stall.
var hostileKinds = []struct {
	name    string
	handler bool // whether the gateway's request handler runs (the headers are complete)
	open    func(c net.Conn, hopID string)
}{
	{"slow headers", false, func(c net.Conn, _ string) {
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: a")
	}},
	{"slow body", true, func(c net.Conn, _ string) {
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"model\":\"m\",")
	}},
	{"declared but unsent body", true, func(c net.Conn, _ string) {
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 209715200\r\n\r\n")
	}},
	{"chunked trickle", true, func(c net.Conn, _ string) {
		io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n")
	}},
	{"stalled gzip bomb", true, func(c net.Conn, _ string) {
		bomb := stalledBomb()
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n", len(bomb))
		c.Write(bomb[:len(bomb)/2]) // half of it: 4 MiB once decompressed, then nothing
	}},
	{"header flood", false, func(c net.Conn, _ string) {
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n")
		for i := 0; i < 56; i++ {
			fmt.Fprintf(c, "X-Flood-%d: %s\r\n", i, strings.Repeat("f", 1000))
		}
	}},
	{"idle, nothing sent", false, func(net.Conn, string) {}},
	{"idle keep-alive", false, func(c net.Conn, _ string) {
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	}},
}

// stalledBomb is 8 MiB of zeros compressed, made once.
var stalledBomb = sync.OnceValue(func() []byte { return gzipOf(bytes.Repeat([]byte("a"), 8<<20)) })

func gzipOf(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestHostileClients holds 200 hostile connections open against a gateway with the default
// limits, serves ordinary clients meanwhile, and measures the live heap: it must stay under
// 64 MiB above the baseline (before the fix for declared lengths, the 25 connections that declare
// 200 MiB bodies alone took 5 GiB).
func TestHostileClients(t *testing.T) {
	const perKind, budget = 25, 64 << 20
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin", f)
	entered := make(chan struct{}, 1024)
	h := g.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			entered <- struct{}{}
			defer func() { g.done <- r.URL.Path }()
		}
		h.ServeHTTP(w, r)
	}))
	g.ConfigureServer(srv.Config) // the default limits: 10s headers, 60s body, 120s idle
	conns := make(chan http.ConnState, 4096)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) { conns <- s }
	srv.Start()
	defer srv.Close()
	addr := hostPort(srv.URL)

	normal := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stream := i%2 == 0
				resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi %d"}]}`, stream, i)))
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Contains(body, []byte("hello")) {
					errs <- fmt.Errorf("normal request: %d %s", resp.StatusCode, body)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	normal(8) // warm up: pools, connections to the worker
	g.waitDone(t, 8)
	base := heapAlloc()

	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	handlers := 0
	for _, k := range hostileKinds {
		for i := 0; i < perKind; i++ {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, c)
			k.open(c, g.hopID)
			if k.handler {
				handlers++
			}
		}
	}
	// Every connection accepted, every request whose headers are complete in its handler.
	timeout := time.After(60 * time.Second)
	for accepted := 0; accepted < len(open); {
		select {
		case s := <-conns:
			if s == http.StateNew {
				accepted++
			}
		case <-timeout:
			t.Fatalf("only %d of %d hostile connections accepted", accepted, len(open))
		}
	}
	for i := 0; i < handlers; i++ {
		select {
		case <-entered:
		case <-timeout:
			t.Fatalf("only %d of %d hostile requests reached their handler", i, handlers)
		}
	}
	normal(40) // ordinary clients are served while the hostile connections are open
	g.waitDone(t, 40)
	held := heapAlloc()
	grew := int64(held) - int64(base)
	t.Logf("live heap: baseline %.1f MiB, with %d hostile connections open %.1f MiB (%+.1f MiB; budget %d MiB)",
		float64(base)/(1<<20), len(open), float64(held)/(1<<20), float64(grew)/(1<<20), budget>>20)
	if grew > budget {
		t.Errorf("the heap grew %.1f MiB with %d hostile connections open; budget %d MiB", float64(grew)/(1<<20), len(open), budget>>20)
	}
	for _, c := range open {
		c.Close()
	}
	open = nil
	g.waitDone(t, handlers) // every hostile request's handler returned once its client left
}

// TestHostileRequests: requests that are complete but hostile get a quick, bounded answer.
func TestHostileRequests(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{MaxPayloadSize: 1 << 20}, "round_robin", f)
	post := func(body io.Reader, hdr ...string) *http.Response {
		resp := g.postFrom(t, "/v1/completions", body, hdr...)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	big := bytes.Repeat([]byte("a"), 2<<20)
	bomb := gzipOf(append([]byte(`{"prompt":"`), bytes.Repeat([]byte("a"), 4<<20)...))
	cases := []struct {
		name string
		do   func() *http.Response
		want int
	}{
		{"declared too large", func() *http.Response { return post(bytes.NewReader(big)) }, 413},
		{"chunked too large", func() *http.Response { return post(io.MultiReader(bytes.NewReader(big))) }, 413},
		{"gzip bomb", func() *http.Response {
			return post(bytes.NewReader(bomb), "Content-Encoding", "gzip")
		}, 413},
		{"unknown encoding", func() *http.Response { return post(strings.NewReader(`{}`), "Content-Encoding", "zstd") }, 415},
		{"own hop id", func() *http.Response {
			return post(strings.NewReader(`{"model":"m","prompt":"x"}`), HopHeader, "feedbeef, "+g.hopID)
		}, 508},
		{"too many hops", func() *http.Response {
			return post(strings.NewReader(`{"model":"m","prompt":"x"}`), HopHeader, strings.Repeat("a,", 20)+"b")
		}, 508},
	}
	base := heapAlloc()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 5; i++ {
				if resp := tc.do(); resp.StatusCode != tc.want {
					t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
				}
			}
		})
	}
	if f.requests() != 0 {
		t.Errorf("%d hostile requests reached the worker", f.requests())
	}
	if grew := int64(heapAlloc()) - int64(base); grew > 16<<20 {
		t.Errorf("the heap kept %d MiB after the hostile requests", grew>>20)
	}
}

// TestMaliciousWorker: a worker sending huge headers, garbage, or a stream without end costs the
// gateway bounded memory, and the client gets a clear answer or its stream until it leaves.
func TestMaliciousWorker(t *testing.T) {
	t.Run("garbage", func(t *testing.T) {
		f := newFakeWorker(t, "m")
		f.setHandler(func(w http.ResponseWriter, r *http.Request) {
			c, buf, _ := http.NewResponseController(w).Hijack()
			buf.WriteString("SSH-2.0-OpenSSH_9.6\r\n\x00\x01garbage\r\n\r\n")
			buf.Flush()
			c.Close()
		})
		g := newTestGateway(t, Config{}, "round_robin", f)
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
		if e := decodeError(t, resp); resp.StatusCode != http.StatusBadGateway || strings.Contains(e.Message, "SSH") || strings.Contains(e.Message, "malformed") {
			t.Errorf("%d %q", resp.StatusCode, e.Message)
		}
	})
	t.Run("endless stream", func(t *testing.T) {
		f := newFakeWorker(t, "m")
		stopped := make(chan struct{})
		f.setHandler(func(w http.ResponseWriter, r *http.Request) {
			defer close(stopped)
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := []byte("data: " + strings.Repeat("x", 4000) + "\n\n")
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		})
		g := newTestGateway(t, Config{}, "round_robin", f)
		base := heapAlloc()
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x","stream":true}`)
		if n, err := io.CopyN(io.Discard, resp.Body, 8<<20); err != nil {
			t.Fatalf("relayed %d bytes: %v", n, err)
		}
		grew := int64(heapAlloc()) - int64(base)
		resp.Body.Close()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker's endless stream went on after the client left")
		}
		g.waitDone(t, 1)
		if grew > 16<<20 {
			t.Errorf("relaying an endless stream held %d MiB", grew>>20)
		}
		if n := totalInflight(g.Server); n != 0 {
			t.Errorf("in flight %d after the client left", n)
		}
	})
	// Huge response headers: TestUpstreamHeaderCap.
}
