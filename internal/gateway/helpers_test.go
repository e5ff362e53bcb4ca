package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// fakeWorker is a minimal OpenAI-compatible worker on a loopback port whose inference handler a
// test may replace.
type fakeWorker struct {
	*httptest.Server
	model string

	mu      sync.Mutex
	handler http.HandlerFunc
	bodies  [][]byte
	headers []http.Header
}

func newFakeWorker(t *testing.T, model string) *fakeWorker {
	t.Helper()
	return newFakeWorkerOn(t, nil, model)
}

// newFakeWorkerOn is newFakeWorker on the in-memory network mn (nil: loopback), for a test in a
// synctest bubble.
func newFakeWorkerOn(t *testing.T, mn *testutil.MemNet, model string) *fakeWorker {
	t.Helper()
	f := &fakeWorker{model: model}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"sglang"}]}`, f.model)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.headers = append(f.headers, r.Header.Clone())
		h := f.handler
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if h == nil {
			h = defaultInference
		}
		h(w, r)
	})
	f.Server = newServerOn(mn, mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeWorker) setHandler(h http.HandlerFunc) {
	f.mu.Lock()
	f.handler = h
	f.mu.Unlock()
}

// hold makes f's next request wait at the worker until release is closed or the test ends, then
// answer as defaultInference does; arrived is closed when that request arrives, so the test can act
// while it is in flight. Only one request may reach f while it holds.
func (f *fakeWorker) hold(t *testing.T) (arrived <-chan struct{}, release chan struct{}) {
	in := make(chan struct{})
	release = make(chan struct{})
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		close(in)
		select {
		case <-release:
		case <-t.Context().Done(): // the test failed before its release: let the servers close
			return
		}
		defaultInference(w, r)
	})
	return in, release
}

func (f *fakeWorker) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// defaultInference answers like an engine: three SSE chunks when streaming, else one completion.
func defaultInference(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if strings.HasSuffix(r.URL.Path, "/embeddings") {
		io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m","usage":{"prompt_tokens":2,"total_tokens":2}}`)
		return
	}
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if chat {
			io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello world"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
		} else {
			io.WriteString(w, `{"id":"c1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","text":"hello world"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, tok := range []string{"hello", " ", "world"} {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
		fl.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// newServerOn starts a test server for h on mn, or on loopback when mn is nil.
func newServerOn(mn *testutil.MemNet, h http.Handler) *httptest.Server {
	if mn == nil {
		return httptest.NewServer(h)
	}
	return mn.NewServer(h)
}

// testGateway is a gateway on a loopback port in front of fake workers. done receives one value
// each time a client request's handler has returned, so tests wait on it instead of sleeping.
type testGateway struct {
	*Server
	srv   *httptest.Server
	admin *httptest.Server // the admin plane, as serve runs it on its own listener
	done  chan string
	// bearer is sent by post when the caller sends no Authorization: the key of auditClient.
	bearer string
	// client sends the test's requests: http.DefaultClient, or the in-memory network's.
	client *http.Client
}

// testAuditKey is the data-plane key, named "audit", that auditClient gives a gateway whose
// audit headers would otherwise be shown to nobody.
const testAuditKey = "test-audit-key"

// auditClient lets the requests of tests see the audit headers: with AuditHeaders on and neither
// an admin key nor a named client, it adds the data-plane key "audit=testAuditKey" and names it.
func auditClient(cfg *Config) (bearer string) {
	if !cfg.AuditHeaders || cfg.AdminKey != "" || len(cfg.AuditHeadersClients) > 0 {
		return ""
	}
	cfg.APIKeys = append(cfg.APIKeys, "audit="+testAuditKey)
	cfg.AuditHeadersClients = []string{"audit"}
	return testAuditKey
}

func newTestGateway(t testing.TB, cfg Config, policyName string, workers ...*fakeWorker) *testGateway {
	t.Helper()
	return newTestGatewayOn(t, nil, cfg, policyName, workers...)
}

// newTestGatewayOn is newTestGateway on the in-memory network mn (nil: loopback): its listeners,
// its transport to the workers and the test's client are mn's, so that a test in a synctest
// bubble runs on the bubble's clock. It is stopped, and its router closed, when t ends.
func newTestGatewayOn(t testing.TB, mn *testutil.MemNet, cfg Config, policyName string, workers ...*fakeWorker) *testGateway {
	t.Helper()
	return newGatewayOver(t, mn, cfg, newRouter(t, policyName, policy.DefaultConfig()), workers...)
}

// newGatewayOver is newTestGatewayOn over router.
func newGatewayOver(t testing.TB, mn *testutil.MemNet, cfg Config, router *policy.Router, workers ...*fakeWorker) *testGateway {
	t.Helper()
	client := http.DefaultClient
	if mn != nil {
		client = mn.Client()
		if cfg.Proxy.Transport == nil {
			tr := proxy.NewTransport()
			tr.DialContext = mn.DialContext
			cfg.Proxy.Transport = tr
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Proxy.Retry.MaxAttempts == 0 {
		cfg.Proxy.Retry = proxy.RetryConfig{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	}
	bearer := auditClient(&cfg)
	s := New(cfg, worker.NewRegistry(), router, nil)
	t.Cleanup(s.Stop)
	for _, f := range workers {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: f.URL}); err != nil {
			t.Fatal(err)
		}
	}
	g := &testGateway{Server: s, done: make(chan string, 1024), bearer: bearer, client: client}
	h := s.Handler()
	g.srv = newServerOn(mn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			// A test that never waits for its requests must not block the handlers (and so
			// the server's Close) once the buffer is full; one that waits reads as they finish.
			select {
			case g.done <- r.URL.Path:
			default:
			}
		}()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	g.admin = newServerOn(mn, s.AdminHandler())
	t.Cleanup(g.admin.Close)
	return g
}

// newRouter returns the router of the named policy over pc, closed when the test ends.
func newRouter(t testing.TB, name string, pc policy.Config) *policy.Router {
	t.Helper()
	router, err := policy.NewRouter(name, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	return router
}

// mustRegister registers each worker with g, failing the test on an error.
func (g *testGateway) mustRegister(t testing.TB, reqs ...AddWorkerRequest) {
	t.Helper()
	for _, r := range reqs {
		if _, err := g.Register(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
}

// waitDone waits for n handler returns, failing after a bound.
func (g *testGateway) waitDone(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-g.done:
		case <-timeout.C:
			t.Fatalf("only %d of %d requests finished", i, n)
		}
	}
}

func (g *testGateway) post(t *testing.T, path, body string, hdr ...string) *http.Response {
	t.Helper()
	return g.postFrom(t, path, strings.NewReader(body), hdr...)
}

// async posts body to path from another goroutine, for a request that must stay in flight
// while the test goes on, and delivers the response on the channel (nil when the transport
// failed: the goroutine calls no t.Fatal, the test's goroutine decides, see answer).
func (g *testGateway) async(ctx context.Context, path, body string, hdr ...string) chan *http.Response {
	ch := make(chan *http.Response, 1)
	go func() {
		resp, err := g.client.Do(g.newPost(ctx, path, strings.NewReader(body), hdr...))
		if err != nil {
			resp = nil
		}
		ch <- resp
	}()
	return ch
}

// answer waits for async's response, failing when the request failed or took past a bound.
func answer(t *testing.T, ch chan *http.Response) *http.Response {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case r := <-ch:
		if r == nil {
			t.Fatal("request failed")
		}
		return r
	case <-timeout.C:
		t.Fatal("no response")
		return nil
	}
}

// answerStatus is answer's status, the body drained and closed.
func answerStatus(t *testing.T, ch chan *http.Response) int {
	t.Helper()
	r := answer(t, ch)
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return r.StatusCode
}

// answerOK is answerStatus, failing the test unless the status is 200.
func answerOK(t *testing.T, ch chan *http.Response) {
	t.Helper()
	if s := answerStatus(t, ch); s != http.StatusOK {
		t.Fatalf("status %d, want 200", s)
	}
}

// wantError checks that resp has the status and the OpenAI error shape, and returns the error.
func wantError(t *testing.T, resp *http.Response, status int) apiError {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d", resp.StatusCode, status)
	}
	return decodeError(t, resp)
}

// countListing returns how many of the engines at urls list model in their /v1/models.
func countListing(t *testing.T, model string, urls ...string) int {
	t.Helper()
	return countListingVia(t, http.DefaultClient, model, urls...)
}

// countListingVia is countListing through client.
func countListingVia(t *testing.T, client *http.Client, model string, urls ...string) int {
	t.Helper()
	n := 0
	for _, u := range urls {
		if listsModelVia(t, client, u, model) {
			n++
		}
	}
	return n
}

// newQuietServer returns a gateway without logs over the named policy, the workers at urls
// registered.
func newQuietServer(t testing.TB, policyName string, urls ...string) *Server {
	t.Helper()
	s := New(Config{Logger: slog.New(slog.DiscardHandler)}, worker.NewRegistry(), newRouter(t, policyName, policy.DefaultConfig()), nil)
	for _, u := range urls {
		if _, err := s.Register(context.Background(), AddWorkerRequest{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// newPost returns a POST of body to path on g under ctx, with g's bearer and then the header
// name/value pairs in hdr (which may override it).
func (g *testGateway) newPost(ctx context.Context, path string, body io.Reader, hdr ...string) *http.Request {
	return testutil.NewPost(ctx, g.srv.URL+path, g.bearer, body, hdr...)
}

// postFrom is post with the body read from body (its length declared when net/http can tell it,
// chunked otherwise), and header name/value pairs in hdr.
func (g *testGateway) postFrom(t *testing.T, path string, body io.Reader, hdr ...string) *http.Response {
	t.Helper()
	resp, err := g.client.Do(g.newPost(context.Background(), path, body, hdr...))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// decodeError asserts the OpenAI error shape and returns the error object.
func decodeError(t *testing.T, resp *http.Response) apiError {
	t.Helper()
	defer resp.Body.Close()
	var e struct {
		Error *apiError `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil {
		t.Fatalf("status %d: body is not an OpenAI error: %s", resp.StatusCode, raw)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("incomplete OpenAI error: %s", raw)
	}
	return *e.Error
}

func totalInflight(s *Server) int64 {
	var n int64
	for _, w := range s.reg.View().All {
		n += w.Inflight()
	}
	return n
}

func proxyTimeout(d time.Duration) proxy.Config { return proxy.Config{RequestTimeout: d} }
