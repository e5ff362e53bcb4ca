package tracing_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/worker"
)

// collector is an in-process OTLP/HTTP trace receiver.
type collector struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			body = zr
		}
		raw, _ := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) named(prefix string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value
		}
	}
	return nil
}

// engines are two loopback workers that record the traceparent they see; the very first
// inference request of the two answers 503, so the request is retried on the other.
type engines struct {
	urls        []string
	calls       atomic.Int32
	mu          sync.Mutex
	traceparent []string
}

func newEngines(t *testing.T) *engines {
	e := &engines{}
	for range 2 {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}`)
		})
		mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
			e.mu.Lock()
			e.traceparent = append(e.traceparent, r.Header.Get("Traceparent"))
			e.mu.Unlock()
			if e.calls.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}`)
		})
		s := httptest.NewServer(mux)
		t.Cleanup(s.Close)
		e.urls = append(e.urls, s.URL)
	}
	return e
}

func newGateway(t *testing.T, tr *tracing.Tracer, e *engines, log *slog.Logger) *httptest.Server {
	t.Helper()
	router, err := policy.NewRouter("cache_aware", policy.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	cfg := gateway.DefaultConfig()
	cfg.Health.Disabled = true
	cfg.Tracer = tr
	cfg.Logger = log
	cfg.AccessLogSample = 1
	cfg.Proxy.Retry.InitialBackoff = time.Millisecond
	gw := gateway.New(cfg, worker.NewRegistry(), router, nil)
	for _, u := range e.urls {
		if _, err := gw.Register(context.Background(), gateway.AddWorkerRequest{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// A proxied request's spans reach an OTLP collector set up from the standard environment, and
// the traceparent each worker saw names the trace the client started and the attempt's span.
func TestSpansReachCollector(t *testing.T) {
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_SERVICE_NAME", "kvgate-test")
	tr, shutdown, err := tracing.Setup(context.Background())
	if err != nil || tr == nil {
		t.Fatalf("Setup: %v %v", tr, err)
	}
	e := newEngines(t)
	access := make(chan string, 4)
	log := slog.New(slog.NewJSONHandler(lineWriter(func(line string) {
		if strings.Contains(line, `"msg":"access"`) {
			access <- line
		}
	}), nil))
	srv := newGateway(t, tr, e, log)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	testutil.MustPostOK(t, srv.URL+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"tell me about caches"}]}`,
		"Traceparent", "00-"+traceID+"-"+parentID+"-01")
	// The access line is written after the request span ends, once the handler has returned.
	var line string
	select {
	case line = <-access:
	case <-time.After(10 * time.Second):
		t.Fatal("no access log line")
	}
	if err := shutdown(context.Background()); err != nil { // flushes every span
		t.Fatal(err)
	}

	reqSpans := col.named("kvgate.request")
	if len(reqSpans) != 1 {
		t.Fatalf("request spans: %d", len(reqSpans))
	}
	root := reqSpans[0]
	if hex.EncodeToString(root.TraceId) != traceID || hex.EncodeToString(root.ParentSpanId) != parentID {
		t.Fatalf("the request span does not continue the client's trace: trace %x parent %x", root.TraceId, root.ParentSpanId)
	}
	if v := attr(root, "kvgate.retries"); v == nil || v.GetIntValue() != 1 {
		t.Errorf("kvgate.retries = %v, want 1", v)
	}
	routes := col.named("kvgate.route")
	if len(routes) != 2 || attr(routes[0], "kvgate.branch").GetStringValue() == "" || attr(routes[0], "kvgate.predicted_prefix_share") == nil {
		t.Fatalf("want two routing-decision spans with branch and predicted share, got %d", len(routes))
	}
	ups := col.named("kvgate.upstream")
	if len(ups) != 2 {
		t.Fatalf("upstream attempt spans: %d, want 2 (a 503, then a retry)", len(ups))
	}
	e.mu.Lock()
	seen := append([]string(nil), e.traceparent...)
	e.mu.Unlock()
	for _, up := range ups {
		if hex.EncodeToString(up.TraceId) != traceID || !bytes.Equal(up.ParentSpanId, root.SpanId) {
			t.Errorf("upstream span not a child of the request span")
		}
		n := attr(up, "kvgate.attempt").GetIntValue()
		want := fmt.Sprintf("00-%s-%s-01", traceID, hex.EncodeToString(up.SpanId))
		if n < 1 || n > 2 || seen[n-1] != want {
			t.Errorf("attempt %d: the worker saw traceparent %q, want %q", n, seen, want)
		}
		if attr(up, "kvgate.worker").GetStringValue() == "" || attr(up, "kvgate.retry").GetBoolValue() != (n == 2) {
			t.Errorf("attempt %d: worker/retry attributes wrong", n)
		}
	}

	for _, want := range []string{`"msg":"access"`, `"status":200`, `"attempts":2`, `"prompt_tokens":10`, `"cached_tokens":4`, `"branch":"`, `"worker":"`, `"model":"m"`} {
		if !strings.Contains(line, want) {
			t.Errorf("access log lacks %s: %s", want, line)
		}
	}
}

// lineWriter hands each log line (slog writes one per call) to a function.
type lineWriter func(string)

func (f lineWriter) Write(b []byte) (int, error) {
	f(string(b))
	return len(b), nil
}

func TestSetupFollowsEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		err  bool
	}{
		{"off by default", nil, false, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, false},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, false},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false, false},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false, false},
		{"grpc refused", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, tc.env[k])
			}
			tr, shutdown, err := tracing.Setup(context.Background())
			if (err != nil) != tc.err || (tr != nil) != tc.on {
				t.Fatalf("Setup: tracer %v err %v; want on=%v err=%v", tr != nil, err, tc.on, tc.err)
			}
			if shutdown != nil {
				shutdown(context.Background())
			}
		})
	}
}

// BenchmarkGateway compares one proxied request with tracing off (the default: a nil Tracer)
// and on (every span recorded in memory), side by side.
func BenchmarkGateway(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			var tr *tracing.Tracer
			if mode == "on" {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
				defer tp.Shutdown(context.Background())
				tr = tracing.New(tp)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			})
			mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, `{"id":"x","choices":[]}`)
			})
			eng := httptest.NewServer(mux)
			defer eng.Close()
			router, _ := policy.NewRouter("cache_aware", policy.DefaultConfig())
			defer router.Close()
			cfg := gateway.DefaultConfig()
			cfg.Health.Disabled = true
			cfg.Tracer = tr
			cfg.Logger = slog.New(slog.DiscardHandler)
			gw := gateway.New(cfg, worker.NewRegistry(), router, nil)
			if _, err := gw.Register(context.Background(), gateway.AddWorkerRequest{URL: eng.URL}); err != nil {
				b.Fatal(err)
			}
			h := gw.Handler()
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"tell me about caches"}]}`)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}

// BenchmarkHooksOff is every tracing hook the gateway calls per request, with tracing off.
func BenchmarkHooksOff(b *testing.B) {
	var tr *tracing.Tracer
	base := http.DefaultTransport
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	b.ReportAllocs()
	for range b.N {
		_, r := tr.StartRequest(req, "/v1/chat/completions")
		r.SetRequest("id", "m")
		r.Decision(1, "cache_aware", "w", "cache_hit", 0.5, true)
		r.End(200, 1)
		if tr.Transport(base) != base {
			b.Fatal("transport wrapped with tracing off")
		}
	}
}
