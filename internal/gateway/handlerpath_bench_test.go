//go:build unix

package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// memTransport is a worker in memory: it reads and closes the request body and answers a
// completion, or ten SSE events handed over one per read, so that a benchmark through it counts
// the gateway's own work and allocations and no network's.
type memTransport struct{}

var (
	memCompletion = []byte(`{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	memEvents     = func() [][]byte {
		var evs [][]byte
		for i := range 10 {
			evs = append(evs, fmt.Appendf(nil, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token%d\"},\"finish_reason\":null}]}\n\n", i))
		}
		return append(evs, []byte("data: [DONE]\n\n"))
	}()
)

// eventReader returns one event per Read, as a worker flushing each token would.
type eventReader struct{ evs [][]byte }

func (r *eventReader) Read(p []byte) (int, error) {
	if len(r.evs) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.evs[0])
	if r.evs[0] = r.evs[0][n:]; len(r.evs[0]) == 0 {
		r.evs = r.evs[1:]
	}
	return n, nil
}

func (*eventReader) Close() error { return nil }

func (memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r, Header: http.Header{}}
	if r.Method == http.MethodGet {
		resp.Body = io.NopCloser(strings.NewReader(`{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`))
		return resp, nil
	}
	var head [512]byte
	n, _ := io.ReadFull(r.Body, head[:])
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if !bytes.Contains(head[:n], []byte(`"stream":true`)) {
		resp.Header["Content-Type"] = []string{"application/json"}
		resp.ContentLength = int64(len(memCompletion))
		resp.Body = io.NopCloser(bytes.NewReader(memCompletion))
		return resp, nil
	}
	resp.Header["Content-Type"] = []string{"text/event-stream"}
	resp.ContentLength = -1
	resp.Body = &eventReader{evs: append([][]byte(nil), memEvents...)}
	return resp, nil
}

// BenchmarkHandlerPath measures what kvgate itself costs per request, in CPU and allocations:
// its real handler (the default cache_aware_hash policy, metrics, audit, the proxy) in front of
// a worker in memory, so that neither loopback sockets nor an upstream server are counted. The
// cases are BenchmarkProxyCost's 1 KB completion and 10-event stream.
//
//	go test -run XXX -bench HandlerPath -benchmem ./internal/gateway/
func BenchmarkHandlerPath(b *testing.B) {
	router := newRouter(b, "cache_aware_hash", policy.DefaultConfig())
	s := New(Config{Logger: slog.New(slog.DiscardHandler), Proxy: proxy.Config{Transport: memTransport{}}},
		worker.NewRegistry(), router, nil)
	if _, err := s.Register(context.Background(), AddWorkerRequest{URL: "http://127.0.0.1:1"}); err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	// Responses1KB is a follow-up turn of the Responses API with a 1 KB input: its worker found
	// by previous_response_id, the answer's id remembered.
	responses := fmt.Appendf(nil, `{"model":"m","input":%q,"previous_response_id":"c1"}`, strings.Repeat("x", 1_000))
	for _, c := range []struct {
		name, path string
		body       []byte
	}{
		{"1KB", "/v1/chat/completions", proxyCostBody(1_000, false)},
		{"SSE10", "/v1/chat/completions", proxyCostBody(1_000, true)},
		{"Responses1KB", "/v1/responses", responses},
	} {
		body := c.body
		b.Run(c.name, func(b *testing.B) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, c.path, bytes.NewReader(body)))
			if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"c1"`)) {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			b.ReportAllocs()
			w := &discardWriter{h: http.Header{}}
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, c.path, bytes.NewReader(body))
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkFlowIdle measures what flow control adds to a request while its queue is empty and
// the pool has headroom: admission (key lookup, tenant, limits, saturation over the pool) and
// release, against the same handler path with the queue off.
//
//	go test -run XXX -bench FlowIdle -benchmem ./internal/gateway/
func BenchmarkFlowIdle(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run("handler/"+name, func(b *testing.B) {
			router := newRouter(b, "cache_aware_hash", policy.DefaultConfig())
			cfg := Config{Logger: slog.New(slog.DiscardHandler), Proxy: proxy.Config{Transport: memTransport{}},
				APIKeys: []string{"team=k1"}, Flow: FlowConfig{Config: flow.Config{Enabled: on}}}
			s := New(cfg, worker.NewRegistry(), router, nil)
			for i := range 8 {
				if _, err := s.Register(context.Background(), AddWorkerRequest{URL: fmt.Sprintf("http://127.0.0.%d:1", i+1)}); err != nil {
					b.Fatal(err)
				}
			}
			h := s.Handler()
			body := proxyCostBody(1_000, false)
			b.ReportAllocs()
			w := &discardWriter{h: http.Header{}}
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer k1")
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
	b.Run("admit", func(b *testing.B) {
		router, _ := policy.NewRouter("cache_aware_hash", policy.DefaultConfig())
		defer router.Close()
		s := New(Config{Logger: slog.New(slog.DiscardHandler), APIKeys: []string{"team=k1"},
			Flow: FlowConfig{Config: flow.Config{Enabled: true}}}, worker.NewRegistry(), router, nil)
		for i := range 8 {
			w, _ := worker.New(worker.Spec{URL: fmt.Sprintf("http://127.0.0.%d:1", i+1), Models: []string{"m"}}, worker.BreakerConfig{Disabled: true})
			w.SetHealth(worker.Ready)
			_ = s.reg.Add(w)
		}
		pol, _ := router.For("m", worker.Regular)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header.Set("Authorization", "Bearer k1")
		fr := &flowRequest{model: "m", candidates: s.reg.View().Pool("m").Regular, pol: pol, preq: &policy.Request{}, bytes: 1000}
		var t flowTicket
		b.ReportAllocs()
		for b.Loop() {
			t = flowTicket{}
			if f := s.flow.admit(req, fr, &t); f != nil {
				b.Fatal(f.msg)
			}
			t.pick()
			t.done()
		}
	})
}
