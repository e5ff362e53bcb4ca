package gateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
)

// Regression tests for the defects found by a security review, one test (or table row) per defect, at the HTTP
// boundary; each failed before its fix.

// Defect 1: the admin API was served on the data plane, with no key, and took text/plain.
func TestAdminPlaneClosedByDefault(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin")
	reg := `{"url":"` + f.URL + `","labels":{"disable_health_check":"true"}}`
	for _, path := range []string{"/workers", "/get_loads"} {
		resp := g.post(t, path, reg)
		if e := decodeError(t, resp); resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s on the data plane: %d %s", path, resp.StatusCode, e.Message)
		}
		resp, err := http.Get(g.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		if decodeError(t, resp); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s on the data plane: %d", path, resp.StatusCode)
		}
	}
	// A cross-site form or text/plain fetch needs no preflight: admin writes refuse it.
	resp, err := http.Post(g.admin.URL+"/workers", "text/plain", strings.NewReader(reg))
	if err != nil {
		t.Fatal(err)
	}
	if decodeError(t, resp); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain registration: %d, want 415", resp.StatusCode)
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Fatalf("%d workers registered", n)
	}
	// On the main port, only with the admin key.
	if err := (Config{AdminOnDataPlane: true}).Validate(); err == nil {
		t.Error("admin routes on the main port without a key were accepted")
	}
	k := newTestGateway(t, Config{AdminOnDataPlane: true, AdminKey: "adm"}, "round_robin")
	if resp := k.post(t, "/workers", reg); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("keyless registration on the main port: %d, want 401", resp.StatusCode)
	}
	if resp := k.post(t, "/workers", reg, "Authorization", "Bearer adm"); resp.StatusCode != http.StatusCreated {
		t.Errorf("registration with the admin key on the main port: %d, want 201", resp.StatusCode)
	}
}

// Defect 2: the body buffer was sized from the declared Content-Length before a byte arrived.
func TestDeclaredLengthAllocatesNothing(t *testing.T) {
	g := newTestGateway(t, Config{MaxPayloadSize: 128 << 20}, "round_robin", newFakeWorker(t, "m"))
	const conns, declared = 4, 64 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < conns; i++ {
		c := rawConn(t, hostPort(g.srv.URL))
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":", declared)
		c.CloseWrite() // the body ends 9 bytes in
		if resp, err := readRawResponse(t, c, 10*time.Second); err == nil && resp.StatusCode == 200 {
			t.Errorf("a truncated body was answered 200")
		}
	}
	g.waitDone(t, conns)
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("%d requests declaring %d MiB and sending 9 bytes allocated %d MiB", conns, declared>>20, grew>>20)
	}
}

// Defect 3: the client's Authorization (this gateway's key) was forwarded to every worker.
func TestClientAuthorizationNotForwarded(t *testing.T) {
	cases := []struct {
		name      string
		forward   bool
		workerKey string
		want      string
	}{
		{name: "stripped", want: ""},
		{name: "worker's own key", workerKey: "worker-key", want: "Bearer worker-key"},
		{name: "forwarded on purpose", forward: true, want: "Bearer gateway-key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeWorker(t, "m")
			cfg := Config{APIKeys: []string{"other", "gateway-key"}}
			cfg.Proxy.ForwardClientAuth = tc.forward
			g := newTestGateway(t, cfg, "round_robin")
			g.mustRegister(t, AddWorkerRequest{URL: f.URL, APIKey: tc.workerKey})
			resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "Authorization", "Bearer gateway-key")
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := f.received(t).header.Get("Authorization")
			if got != tc.want {
				t.Errorf("worker saw Authorization %q, want %q", got, tc.want)
			}
		})
	}
}

// Defect 4: no body read deadline (a half-sent body held a concurrency slot for ever) and no
// idle timeout.
func TestBodyReadDeadlineFreesTheSlot(t *testing.T) {
	g := newTestGateway(t, Config{MaxConcurrentRequests: 1, Limits: Limits{BodyReadTimeout: 300 * time.Millisecond}}, "round_robin", newFakeWorker(t, "m"))
	c := rawConn(t, hostPort(g.srv.URL))
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":\"m\",")
	resp, err := readRawResponse(t, c, 10*time.Second)
	if err != nil {
		t.Fatalf("a half-sent body got no answer: %v", err)
	}
	if e := decodeError(t, resp); resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("half-sent body: %d %s, want 408", resp.StatusCode, e.Message)
	}
	g.waitDone(t, 1)
	ok := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	io.Copy(io.Discard, ok.Body)
	ok.Body.Close()
	if ok.StatusCode != 200 {
		t.Errorf("the slot stayed taken: %d", ok.StatusCode)
	}
}

func TestServerConnectionLimits(t *testing.T) {
	g := newTestGateway(t, Config{Limits: Limits{HeaderReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, MaxHeaderBytes: 8 << 10}}, "round_robin", newFakeWorker(t, "m"))
	srv := httptest.NewUnstartedServer(g.Handler())
	g.ConfigureServer(srv.Config)
	srv.Start()
	t.Cleanup(srv.Close)
	addr := hostPort(srv.URL)

	t.Run("slow headers", func(t *testing.T) {
		c := rawConn(t, addr)
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n") // and never the blank line
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 512)); err == nil {
			// The server may answer 408 before closing; what matters is that it closes.
			_, err = io.ReadAll(c)
			if err != nil {
				t.Fatalf("connection not closed: %v", err)
			}
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("slow headers held the connection %v", d)
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c := rawConn(t, addr)
		rawRequest(t, c, "GET", "/health", "")
		resp, err := readRawResponse(t, c, 5*time.Second)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection: read %d, %v; want EOF", n, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("idle connection closed after %v", d)
		}
	})
	t.Run("header flood", func(t *testing.T) {
		c := rawConn(t, addr)
		rawRequest(t, c, "GET", "/health", "", "X-Flood", strings.Repeat("a", 64<<10))
		resp, err := readRawResponse(t, c, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("64 KiB header against an 8 KiB cap: %d, want 431", resp.StatusCode)
		}
	})
}

// Defect 5: registering the gateway's own address made one request bounce until retries and
// timeouts ran out. Two gateways that list each other still loop at request time: the second
// time a request reaches a gateway it is refused with 508.
func TestLoopStopped(t *testing.T) {
	a := newTestGateway(t, Config{}, "round_robin")
	b := newTestGateway(t, Config{}, "round_robin")
	if _, err := a.Register(context.Background(), AddWorkerRequest{URL: b.srv.URL, ModelID: "m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Register(context.Background(), AddWorkerRequest{URL: a.srv.URL, ModelID: "m"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hits := 0
	h := a.srv.Config.Handler
	a.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		h.ServeHTTP(w, r)
	})
	resp := a.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	e := decodeError(t, resp)
	if resp.StatusCode != http.StatusLoopDetected || e.Code != "loop_detected" {
		t.Errorf("looped request: %d %+v, want 508 loop_detected", resp.StatusCode, e)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 2 {
		t.Errorf("the gateway served the request %d times, want 2 (the client's, and the one that came back)", hits)
	}
}

// Defect 6: the probe and 502s echoed what they found (a port scanner and content oracle), and a
// password in a worker URL was shown wherever the URL was.
func TestNoInternalDetailToClients(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# HELP secret_metric internal page\n")
	}))
	t.Cleanup(garbage.Close)
	g := newTestGateway(t, Config{}, "round_robin")
	for _, u := range []string{dead.URL, garbage.URL} {
		resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+u+`"}`, "")
		for _, leak := range []string{"refused", "dial", "invalid character", "secret_metric", "HELP"} {
			if strings.Contains(string(raw), leak) {
				t.Errorf("probe of %s answered %d %s: leaks %q", u, resp.StatusCode, raw, leak)
			}
		}
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("probe of %s: %d", u, resp.StatusCode)
		}
	}

	// A worker that breaks the connection: the 502 names neither it nor the Go error.
	broken := newFakeWorker(t, "m")
	broken.setHandler(func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close()
	})
	b := newTestGateway(t, Config{}, "round_robin", broken)
	resp := b.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	id := resp.Header.Get("X-Request-Id")
	e := decodeError(t, resp)
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(e.Message, hostPort(broken.URL)) || strings.Contains(e.Message, "EOF") || !strings.Contains(e.Message, id) {
		t.Errorf("502: %d %q (request id %s)", resp.StatusCode, e.Message, id)
	}
}

func TestWorkerURLCredentialsRedacted(t *testing.T) {
	f := newFakeWorker(t, "m")
	var logs bytes.Buffer
	var logMu sync.Mutex
	g := newTestGateway(t, Config{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))}, "round_robin")
	withPass := strings.Replace(f.URL, "http://", "http://admin:s3cret@", 1)
	resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+withPass+`"}`, "")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register: %d %s", resp.StatusCode, raw)
	}
	r := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	user, pass, _ := (&http.Request{Header: f.received(t).header}).BasicAuth()
	if user != "admin" || pass != "s3cret" {
		t.Errorf("the worker got basic auth %q:%q, want the URL's credentials", user, pass)
	}
	shown := map[string]string{"POST /workers": string(raw)}
	_, list := adminDo(t, g, "GET", "/workers", "", "")
	shown["GET /workers"] = string(list)
	_, loads := adminDo(t, g, "GET", "/get_loads", "", "")
	shown["GET /get_loads"] = string(loads)
	rec := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	shown["metrics"] = rec.Body.String()
	logMu.Lock()
	shown["log"] = logs.String()
	logMu.Unlock()
	for where, text := range shown {
		if strings.Contains(text, "s3cret") {
			t.Errorf("%s shows the password: %s", where, text)
		}
	}
	if !strings.Contains(shown["GET /workers"], "redacted@") {
		t.Errorf("GET /workers: %s", list)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Defect 7: the registration lock was held across the probe, so one black-holed worker delayed
// every other registration.
func TestProbeDoesNotBlockOtherRegistrations(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := hole.Accept() // then never answer
		if err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		hole.Close()
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	g := newTestGateway(t, Config{ProbeTimeout: 20 * time.Second}, "round_robin")
	ctx, cancel := context.WithCancel(context.Background())
	blocked := make(chan error, 1)
	go func() {
		_, err := g.Register(ctx, AddWorkerRequest{URL: "http://" + hole.Addr().String()})
		blocked <- err
	}()
	c := testutil.Recv(t, accepted, "the black-holed probe's connection") // the probe is under way
	accepted <- c
	f := newFakeWorker(t, "m")
	g.mustRegister(t, AddWorkerRequest{URL: f.URL})
	// The black-holed probe ends only with its 20 s timeout or the cancel below: a registration
	// that waited behind it would return after it.
	select {
	case err := <-blocked:
		t.Fatalf("a registration waited behind a black-holed probe, which ended first: %v", err)
	default:
	}
	if _, err := g.Register(context.Background(), AddWorkerRequest{URL: "http://" + hole.Addr().String(), ModelID: "m"}); err == nil || !strings.Contains(err.Error(), "being registered") {
		t.Errorf("second registration of a URL being probed: %v", err)
	}
	cancel()
	if err := testutil.Recv(t, blocked, "the black-holed registration's end"); err == nil {
		t.Error("the black-holed worker was registered")
	}
}

// Defect 9: a client's bootstrap fields stayed next to the gateway's in disaggregated requests.
func TestClientBootstrapFieldsDropped(t *testing.T) {
	p, d := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin")
	for _, a := range []AddWorkerRequest{{URL: p.URL, WorkerType: "prefill"}, {URL: d.URL, WorkerType: "decode"}} {
		if _, err := g.Register(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	resp := g.post(t, "/generate", `{"text":"hi","bootstrap_host":"evil.example","bootstrap_room":7,"bootstrap\u005fport":1,"sampling_params":{"bootstrap_host":"kept"}}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	g.waitDone(t, 1) // the handler returns after the prefill request too has ended
	for _, f := range []*fakeWorker{p, d} {
		f.mu.Lock()
		bodies := f.bodies
		f.mu.Unlock()
		if len(bodies) != 1 {
			t.Fatalf("the worker got %d requests", len(bodies))
		}
		body := bodies[0]
		if n := bytes.Count(body, []byte(`"bootstrap_host"`)); n != 2 { // the gateway's, and the nested one
			t.Errorf("%d bootstrap_host keys in %s", n, body)
		}
		var got struct {
			Host   string `json:"bootstrap_host"`
			Room   uint64 `json:"bootstrap_room"`
			Port   *int   `json:"bootstrap_port"`
			Params struct {
				Host string `json:"bootstrap_host"`
			} `json:"sampling_params"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		if got.Host != "127.0.0.1" || got.Room == 7 || got.Port != nil || got.Params.Host != "kept" || got.Text != "hi" {
			t.Errorf("worker body %s", body)
		}
	}
}

// Defect 10: per-worker label values were not bounded.
func TestRegistrationLabelBounds(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin")
	many := map[string]string{}
	for i := 0; i < 100; i++ {
		many[fmt.Sprint("k", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	for _, labels := range []string{
		`{"health_check_interval":"1ns"}`,
		`{"cb_timeout":"1ns"}`,
		`{"cb_failure_rate_window":"1000000000"}`,
		`{"note":"` + strings.Repeat("x", 1000) + `"}`,
		string(manyJSON),
	} {
		resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+f.URL+`","labels":`+labels+`}`, "")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("labels %.60s: %d %s", labels, resp.StatusCode, raw)
		}
	}
}

// Defect 11: a client that half-closed after a complete request got 200 with an empty body.
func TestHalfClosedClientGetsNoFalseAnswer(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin", newFakeWorker(t, "m"))
	for _, stream := range []string{"false", "true"} {
		c := rawConn(t, hostPort(g.srv.URL))
		rawRequest(t, c, "POST", "/v1/completions", `{"model":"m","prompt":"x","stream":`+stream+`}`)
		c.CloseWrite()
		resp, err := readRawResponse(t, c, 10*time.Second)
		if err != nil {
			continue // the connection was cut: the client knows it got no answer
		}
		body, err := io.ReadAll(resp.Body)
		if err == nil && (resp.StatusCode == 200) && !bytes.Contains(body, []byte("hello")) {
			t.Errorf("stream=%s: %d with body %q: an empty success", stream, resp.StatusCode, body)
		}
	}
}

// Defect 12: worker response headers were relayed without a cap.
func TestUpstreamHeaderCap(t *testing.T) {
	f := newFakeWorker(t, "m")
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 64; i++ {
			w.Header().Set(fmt.Sprint("X-Big-", i), strings.Repeat("b", 32<<10))
		}
		defaultInference(w, r)
	})
	g := newTestGateway(t, Config{Proxy: proxy.Config{Retry: proxy.RetryConfig{MaxAttempts: 1}}}, "round_robin", f)
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	size := 0
	for k, vs := range resp.Header {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	decodeError(t, resp)
	if resp.StatusCode != http.StatusBadGateway || size > 64<<10 {
		t.Errorf("a worker's 2 MiB of headers: %d, %d header bytes relayed", resp.StatusCode, size)
	}
}

// received returns the last request the worker recorded, failing the test if there is none.
func (f *fakeWorker) received(t *testing.T) (r struct {
	body   []byte
	header http.Header
}) {
	t.Helper()
	f.mu.Lock()
	n := len(f.bodies)
	if n > 0 {
		r.body, r.header = f.bodies[n-1], f.headers[n-1]
	}
	f.mu.Unlock()
	if n == 0 {
		t.Fatal("the worker received no request")
	}
	return r
}

// Defect 8 (YAML keys read as numbers) is tested in cmd/kvgate, where the config file is read.

func TestGzipRequestBodies(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{MaxPayloadSize: 1 << 20}, "round_robin", f)
	send := func(body []byte, enc string) *http.Response {
		req, _ := http.NewRequest("POST", g.srv.URL+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", enc)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	resp := send(gz([]byte(`{"model":"m","prompt":"x"}`)), "gzip")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	first := f.received(t)
	got, hdr := string(first.body), first.header.Get("Content-Encoding")
	if resp.StatusCode != 200 || got != `{"model":"m","prompt":"x"}` || hdr != "" {
		t.Errorf("gzip body: %d; worker got %q with Content-Encoding %q", resp.StatusCode, got, hdr)
	}
	bomb := gz(append(append([]byte(`{"model":"m","prompt":"`), bytes.Repeat([]byte("a"), 8<<20)...), `"}`...))
	if resp := send(bomb, "gzip"); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a %d KiB gzip bomb of 8 MiB: %d, want 413", len(bomb)>>10, resp.StatusCode)
	} else {
		decodeError(t, resp)
	}
	// Incompressible enough to pass the ratio check, and over the cap once decompressed.
	noise := make([]byte, 600<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	prompt := append(append([]byte(`{"model":"m","prompt":"`), []byte(hex.EncodeToString(noise))...), `"}`...)
	if resp := send(gz(prompt), "gzip"); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("1.2 MiB decompressed against a 1 MiB cap: %d, want 413", resp.StatusCode)
	} else if e := decodeError(t, resp); !strings.Contains(e.Message, "decompressed") {
		t.Errorf("message %q", e.Message)
	}
	if resp := send([]byte("not gzip"), "gzip"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad gzip: %d, want 400", resp.StatusCode)
	}
	if resp := send([]byte(`{"model":"m","prompt":"x"}`), "br"); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("br: %d, want 415", resp.StatusCode)
	} else {
		decodeError(t, resp)
	}
}

func TestClientFacingAnswers(t *testing.T) {
	g := newTestGateway(t, Config{MaxConcurrentRequests: 1}, "round_robin", newFakeWorker(t, "m"))
	t.Run("405 with Allow", func(t *testing.T) {
		resp, err := http.Get(g.srv.URL + "/v1/chat/completions")
		if err != nil {
			t.Fatal(err)
		}
		e := decodeError(t, resp)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" || e.Code != "method_not_allowed" {
			t.Errorf("%d Allow=%q %+v", resp.StatusCode, resp.Header.Get("Allow"), e)
		}
	})
	t.Run("model retrieve", func(t *testing.T) {
		c := sdkClient(g, "x")
		m, err := c.Models.Get(context.Background(), "m")
		if err != nil || m.ID != "m" {
			t.Errorf("%+v %v", m, err)
		}
		_, err = c.Models.Get(context.Background(), "nope")
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Errorf("unknown model: %v", err)
		}
	})
	t.Run("Retry-After", func(t *testing.T) {
		empty := newTestGateway(t, Config{}, "round_robin")
		resp := empty.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
		decodeError(t, resp)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After: %d %v", resp.StatusCode, resp.Header)
		}
		rec := httptest.NewRecorder()
		writeError(rec, http.StatusTooManyRequests, "too_many_requests", "x")
		if rec.Header().Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	})
}

func TestCORS(t *testing.T) {
	preflight := func(g *testGateway, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, g.srv.URL+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, x-stainless-os")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	off := newTestGateway(t, Config{}, "round_robin", newFakeWorker(t, "m"))
	if resp := preflight(off, "https://app.example"); resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.StatusCode < 400 {
		t.Errorf("CORS answered without --cors-allowed-origins: %d %v", resp.StatusCode, resp.Header)
	}
	on := newTestGateway(t, Config{CORSAllowedOrigins: []string{"https://app.example"}}, "round_robin", newFakeWorker(t, "m"))
	resp := preflight(on, "https://app.example")
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "authorization") ||
		!strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
		t.Errorf("allowed preflight: %d %v", resp.StatusCode, h)
	}
	if resp := preflight(on, "https://evil.example"); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin's preflight: %d %v", resp.StatusCode, resp.Header)
	}
	r := on.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "Origin", "https://app.example")
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || !strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
		t.Errorf("actual request: %v", r.Header)
	}
}

func TestKeys(t *testing.T) {
	g := newTestGateway(t, Config{APIKeys: []string{"k1", "k2"}, AdminKey: "adm"}, "round_robin", newFakeWorker(t, "m"))
	for key, want := range map[string]int{"k1": 200, "k2": 200, "k": 401, "k11": 401, "": 401, "adm": 401} {
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "Authorization", "Bearer "+key)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("key %q: %d, want %d", key, resp.StatusCode, want)
		}
		if want == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("401 without WWW-Authenticate")
		}
	}
	if resp, _ := adminDo(t, g, "GET", "/workers", "", "k1"); resp.StatusCode != 401 {
		t.Errorf("a data-plane key opened the admin plane: %d", resp.StatusCode)
	}
}

func TestAllowedWorkerHosts(t *testing.T) {
	f := newFakeWorker(t, "m")
	if err := (Config{AllowedWorkerHosts: []string{"10.0.0.0/33"}}).Validate(); err == nil {
		t.Error("a bad CIDR was accepted")
	}
	g := newTestGateway(t, Config{AllowedWorkerHosts: []string{"10.0.0.0/8", ".svc.cluster.local"}}, "round_robin")
	resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+f.URL+`"}`, "")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("127.0.0.1 outside 10.0.0.0/8: %d %s", resp.StatusCode, raw)
	}
	r, _ := parseHostRules([]string{"10.0.0.0/8", "gpu-1", "*.svc.cluster.local", "fd00::/8"})
	for host, want := range map[string]bool{"10.1.2.3": true, "11.0.0.1": false, "gpu-1": true, "gpu-2": false,
		"a.svc.cluster.local": true, "svc.cluster.local.evil": false, "fd00::1": true, "::ffff:10.0.0.1": true, "169.254.169.254": false} {
		if r.allows(host) != want {
			t.Errorf("allows(%s) = %v", host, !want)
		}
	}
}

// FuzzHostRules: any entry list parses or fails cleanly, and allows never panics; an address
// inside a listed network is allowed.
func FuzzHostRules(f *testing.F) {
	f.Add("10.0.0.0/8,gpu-1,.svc.cluster.local,fd00::/8", "10.1.2.3")
	f.Add("*.example.com", "a.example.com")
	f.Add("[::1]", "::1")
	f.Fuzz(func(t *testing.T, entries, host string) {
		r, err := parseHostRules(strings.Split(entries, ","))
		if err != nil {
			return
		}
		r.allows(host)
		for _, p := range r.nets {
			if !r.allows(p.Addr().String()) {
				t.Errorf("rules %q refuse %s, inside %s", entries, p.Addr(), p)
			}
		}
	})
}

// FuzzWithoutBootstrap: for any JSON object, the result is a JSON object with the same members
// except the top-level bootstrap_* ones.
func FuzzWithoutBootstrap(f *testing.F) {
	f.Add([]byte(`{"text":"hi","bootstrap_host":"evil","bootstrap_room":7,"nested":{"bootstrap_host":"kept"}}`))
	f.Add([]byte(`{"bootstrap\u005fport":1,"a":"<&>"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil {
			return
		}
		var out map[string]json.RawMessage
		if err := json.Unmarshal(withoutBootstrap(body), &out); err != nil {
			t.Fatalf("not JSON any more: %v", err)
		}
		for k, v := range in {
			_, kept := out[k]
			if strings.HasPrefix(k, "bootstrap_") == kept {
				t.Errorf("key %q kept=%v", k, kept)
			}
			if kept {
				var a, b any
				json.Unmarshal(v, &a)
				json.Unmarshal(out[k], &b)
				if fmt.Sprint(a) != fmt.Sprint(b) {
					t.Errorf("member %q changed: %s -> %s", k, v, out[k])
				}
			}
		}
	})
}
