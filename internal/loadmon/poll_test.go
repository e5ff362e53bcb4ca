package loadmon

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestPollsAGzipWorker: a worker that compresses its answer is polled like any other.
func TestPollsAGzipWorker(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	gz := func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(rw)
		io.WriteString(zw, busyLoads)
		zw.Close()
	}
	w, h := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{"/v1/loads": http.HandlerFunc(gz)})
	addWorkers(t, reg, w)
	for range 3 {
		m.PollOnce(t.Context())
		if r, ok := m.Report(w); !ok || r.Backlog() != 10 {
			f, _ := m.Snapshot().Failure(w.ID)
			t.Fatalf("report %+v %v, want backlog 10; failure %+v", r, ok, f)
		}
	}
	if got := h.get("/v1/loads"); got != 3 {
		t.Fatalf("/v1/loads hit %d times, want 3", got)
	}
}

// TestPollEncodings: a poll asks for no compression (prometheus_client's ASGI app, SGLang's
// /metrics, gzips only when asked), so such a worker answers plain text; a worker that compresses unasked
// is inflated, within MaxBody (a small gzip bomb fails the poll); an encoding the monitor cannot
// read fails the poll instead of reaching the parser.
func TestPollEncodings(t *testing.T) {
	gzipped := func(body string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, body)
		zw.Close()
		return b.Bytes()
	}
	// promLike answers as prometheus_client does: gzip if and only if the request accepts it.
	var askedGzip atomic.Int64
	promLike := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			askedGzip.Add(1)
			rw.Header().Set("Content-Encoding", "gzip")
			rw.Write(gzipped(vllmMetrics))
			return
		}
		io.WriteString(rw, vllmMetrics)
	})
	encoded := func(enc string, body []byte) http.HandlerFunc {
		return func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Encoding", enc)
			rw.Write(body)
		}
	}
	tests := []struct {
		name    string
		handler http.Handler
		ok      bool
	}{
		{"prometheus_client asked for nothing", promLike, true},
		{"gzip unasked", encoded("gzip", gzipped(vllmMetrics)), true},
		{"x-gzip unasked", encoded("X-Gzip", gzipped(vllmMetrics)), true},
		{"identity", encoded("identity", []byte(vllmMetrics)), true},
		{"gzip bomb over MaxBody", encoded("gzip", gzipped(vllmMetrics+strings.Repeat("#", 1<<20))), false},
		{"corrupt gzip", encoded("gzip", []byte("\x1f\x8bnot gzip at all")), false},
		{"brotli", encoded("br", []byte(vllmMetrics)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := worker.NewRegistry()
			m, _, _ := testMonitor(t, reg, Config{MaxBody: 64 << 10})
			w, h := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/metrics": tt.handler})
			addWorkers(t, reg, w)
			for range 2 { // the second poll reuses the connection and the gzip reader
				m.PollOnce(t.Context())
				r, ok := m.Report(w)
				if ok != tt.ok || (ok && r.Backlog() != 13) {
					f, _ := m.Snapshot().Failure(w.ID)
					t.Fatalf("report %+v %v, want ok %v (backlog 13); failure %+v", r, ok, tt.ok, f)
				}
			}
			if got := h.get("/metrics"); got != 2 {
				t.Fatalf("/metrics hit %d times, want 2", got)
			}
		})
	}
	if n := askedGzip.Load(); n != 0 {
		t.Errorf("%d polls asked for gzip", n)
	}
}

func TestRedirectedMetrics(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	w, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{
		"/metrics":  http.RedirectHandler("/metrics/", http.StatusTemporaryRedirect),
		"/metrics/": serveBody(200, vllmMetrics),
	})
	addWorkers(t, reg, w)
	for range 2 {
		m.PollOnce(t.Context())
		if r, ok := m.Report(w); !ok || r.Backlog() != 13 {
			f, _ := m.Snapshot().Failure(w.ID)
			t.Fatalf("report %+v %v, want backlog 13; failure %+v", r, ok, f)
		}
	}
}

// TestRedirectsStayOnTheWorker: a poll follows a redirect on the worker's own scheme and host,
// with its api key, up to maxRedirects hops; a redirect to another address is never followed (the
// other server sees no request, and no key), and fails the poll with the redirect's status.
func TestRedirectsStayOnTheWorker(t *testing.T) {
	var elsewhereHits atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		elsewhereHits.Add(1)
		io.WriteString(rw, vllmMetrics)
	}))
	t.Cleanup(elsewhere.Close)
	keys := make(chan string, 16)
	tests := []struct {
		name   string
		routes func(self string) map[string]http.Handler
		ok     bool
		status int // of the failure, when !ok
	}{
		{"absolute, same origin", func(self string) map[string]http.Handler {
			return map[string]http.Handler{
				"/metrics": http.RedirectHandler(self+"/m2", http.StatusFound),
				"/m2": http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
					keys <- r.Header.Get("Authorization")
					io.WriteString(rw, vllmMetrics)
				}),
			}
		}, true, 0},
		{"to another host", func(string) map[string]http.Handler {
			return map[string]http.Handler{"/metrics": http.RedirectHandler(elsewhere.URL+"/metrics", http.StatusTemporaryRedirect)}
		}, false, http.StatusTemporaryRedirect},
		{"to another scheme", func(self string) map[string]http.Handler {
			return map[string]http.Handler{"/metrics": http.RedirectHandler("https"+strings.TrimPrefix(self, "http")+"/m2", http.StatusMovedPermanently)}
		}, false, http.StatusMovedPermanently},
		{"a loop ends", func(string) map[string]http.Handler {
			return map[string]http.Handler{"/metrics": http.RedirectHandler("/metrics", http.StatusPermanentRedirect)}
		}, false, http.StatusPermanentRedirect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := worker.NewRegistry()
			m, _, _ := testMonitor(t, reg, Config{})
			var self string
			routes := map[string]http.Handler{"/": http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				if h, ok := tt.routes(self)[r.URL.Path]; ok {
					h.ServeHTTP(rw, r)
					return
				}
				http.NotFound(rw, r)
			})}
			w, h := fakeWorker(t, worker.Spec{Runtime: "vllm", APIKey: "k1"}, routes)
			self = w.Spec.URL
			addWorkers(t, reg, w)
			m.PollOnce(t.Context())
			r, ok := m.Report(w)
			if ok != tt.ok || (ok && r.Backlog() != 13) {
				t.Fatalf("report %+v %v, want ok %v", r, ok, tt.ok)
			}
			if !tt.ok {
				f, _ := m.Snapshot().Failure(w.ID)
				if want := fmt.Sprintf("status %d", tt.status); !strings.Contains(f.Err, want) {
					t.Fatalf("failure %q, want %q", f.Err, want)
				}
			}
			if tt.name == "a loop ends" {
				if got := h.get("/metrics"); got != 1+maxRedirects {
					t.Fatalf("/metrics hit %d times, want %d", got, 1+maxRedirects)
				}
			}
			if tt.ok {
				if k := <-keys; k != "Bearer k1" {
					t.Fatalf("the redirected poll carried Authorization %q, want the worker's key", k)
				}
			}
		})
	}
	if n := elsewhereHits.Load(); n != 0 {
		t.Fatalf("another host got %d polls", n)
	}
}

// TestPollBodyBounds: a body over MaxBody and a body shorter than its declared length fail the
// poll; the healthy worker beside them is polled.
func TestPollBodyBounds(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{MaxBody: 2 << 10})
	ok, _ := fakeWorker(t, worker.Spec{Runtime: "vllm"}, map[string]http.Handler{"/metrics": serveBody(200, vllmMetrics)})
	huge, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/": serveBody(200, strings.Repeat(" ", 4<<10))})
	truncated, _ := fakeWorker(t, worker.Spec{}, map[string]http.Handler{"/": http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Length", "100")
		io.WriteString(rw, `{"loads":[]}`)
	})})
	addWorkers(t, reg, ok, huge, truncated)
	m.PollOnce(t.Context())
	s := m.Snapshot()
	if e, got := s.Entry(ok.ID); !got || e.Report.Backlog() != 13 {
		t.Fatalf("healthy vLLM worker: entry %+v %v", e, got)
	}
	for name, w := range map[string]*worker.Worker{"huge": huge, "truncated": truncated} {
		if _, got := s.Entry(w.ID); got {
			t.Errorf("%s worker has an entry", name)
		}
	}
}

// TestAPIKeyCannotInjectHeaders: a worker's api key with CR/LF in it never becomes header lines
// of a poll request; the worker is polled without it and the poll fails.
func TestAPIKeyCannotInjectHeaders(t *testing.T) {
	reg := worker.NewRegistry()
	m, _, _ := testMonitor(t, reg, Config{})
	injected := make(chan string, 8)
	w, _ := fakeWorker(t, worker.Spec{Runtime: "sglang"}, map[string]http.Handler{
		"/": http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if v := r.Header.Get("X-Evil"); v != "" {
				injected <- v
			}
			io.WriteString(rw, busyLoads)
		}),
	})
	w.Spec.APIKey = "key\r\nX-Evil: 1"
	addWorkers(t, reg, w)
	m.PollOnce(t.Context())
	select {
	case v := <-injected:
		t.Fatalf("the api key injected a header line: X-Evil: %s", v)
	default:
	}
	if _, ok := m.Report(w); ok {
		t.Error("a worker whose api key cannot be sent was polled as if it could")
	}
}
