package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
)

// chatBody returns a chat request whose prompt is about size bytes.
func chatBody(size int, stream bool) []byte {
	words := strings.Repeat("lorem ipsum dolor sit amet ", size/27+1)[:size]
	return []byte(fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}]}`, stream, words))
}

// discardWriter is a ResponseWriter that keeps nothing, so the benchmark counts the gateway's
// allocations and not a recorder's.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkProxyPath measures one request through the gateway's handler to a loopback worker
// that answers at once. B/op against the body size shows how many copies of the body are made.
//
//	go test -run XXX -bench ProxyPath -benchmem ./internal/gateway/
func BenchmarkProxyPath(b *testing.B) {
	fw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"data":[{"id":"m","owned_by":"sglang"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	}))
	defer fw.Close()
	s := newQuietServer(b, "cache_aware", fw.URL)
	h := s.Handler()
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		body := chatBody(size, false)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			w := &discardWriter{h: http.Header{}}
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				clear(w.h)
				h.ServeHTTP(w, req)
			}
			b.ReportMetric(float64(len(body)), "body-bytes")
		})
	}
}

// BenchmarkAddedLatency drives the same closed-loop load at a simulated engine directly and
// through the gateway, alternating phases in one run, and reports each path's p50 and p99 and
// the ratios (gateway / direct). b.N is the number of requests per path.
//
//	go test -run XXX -bench AddedLatency -benchtime 400x ./internal/gateway/
//
// Two workers: "echo" answers at once, so the ratio is the gateway's raw cost against a bare
// loopback round trip; "sim" is the engine simulator generating 8 tokens (tens of ms, as a real
// engine), so the ratio is what a client of a real fleet would notice.
func BenchmarkAddedLatency(b *testing.B) {
	for _, backend := range []string{"echo", "sim"} {
		for _, size := range []int{1 << 10, 100 << 10} {
			b.Run(fmt.Sprintf("%s/%dKB", backend, size>>10), func(b *testing.B) { benchAddedLatency(b, backend, size) })
		}
	}
}

func benchAddedLatency(b *testing.B, backend string, size int) {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"data":[{"id":"m","owned_by":"sglang"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	})
	if backend == "sim" {
		engine := sim.NewServer(sim.Config{Model: "m"})
		defer engine.Close()
		h = engine
	}
	es := httptest.NewServer(h)
	defer es.Close()
	s := newQuietServer(b, "cache_aware", es.URL)
	gs := httptest.NewServer(s.Handler())
	defer gs.Close()

	const conc, phases = 4, 4
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	body := chatBody(size, false)
	var direct, viaGW []time.Duration
	// Warm both paths (connections, and the engine's prefix cache) before measuring.
	drive(b, client, es.URL+"/v1/chat/completions", body, conc, 2*conc)
	drive(b, client, gs.URL+"/v1/chat/completions", body, conc, 2*conc)
	b.ResetTimer()
	start := time.Now()
	for ph := 0; ph < phases*2; ph++ {
		url, dst := es.URL, &direct
		if ph%2 == 1 {
			url, dst = gs.URL, &viaGW
		}
		*dst = append(*dst, drive(b, client, url+"/v1/chat/completions", body, conc, max(b.N/phases, conc))...)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	dp50, dp99 := pct(direct, 50), pct(direct, 99)
	gp50, gp99 := pct(viaGW, 50), pct(viaGW, 99)
	b.ReportMetric(float64(dp50.Microseconds()), "direct-p50-us")
	b.ReportMetric(float64(dp99.Microseconds()), "direct-p99-us")
	b.ReportMetric(float64(gp50.Microseconds()), "gw-p50-us")
	b.ReportMetric(float64(gp99.Microseconds()), "gw-p99-us")
	b.ReportMetric(float64(gp50)/float64(dp50), "p50-ratio")
	b.ReportMetric(float64(gp99)/float64(dp99), "p99-ratio")
	b.ReportMetric(float64(len(direct)+len(viaGW))/elapsed.Seconds(), "req/s")
}

// drive sends n requests from conc goroutines and returns their latencies.
func drive(b *testing.B, c *http.Client, url string, body []byte, conc, n int) []time.Duration {
	var mu sync.Mutex
	var out []time.Duration
	var wg sync.WaitGroup
	per := n / conc
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				t0 := time.Now()
				resp, err := c.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				out = append(out, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
