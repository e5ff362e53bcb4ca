package gateway

import (
	"bufio"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// internalDetail is what a crashing engine writes in its 500 answer: a host name, an internal
// address, a traceback with paths.
const internalDetail = "CUDA OOM on gpu-17.internal (10.0.3.17): Traceback (most recent call last):\n  File \"/opt/vllm/engine.py\", line 1\n"

// TestWorkerServerErrorIsReplaced: a worker's 5xx text never reaches the client, who gets the
// worker's status, a generic OpenAI-shaped error with the request id, and the worker's
// Retry-After; the text goes to the log, cut to a bounded length. A 4xx validation message from
// the engine reaches the client as it is.
func TestWorkerServerErrorIsReplaced(t *testing.T) {
	f := newFakeWorker(t, "m")
	logs := &testutil.SyncBuffer{}
	g := newTestGateway(t, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, "round_robin", f)
	for _, code := range []int{500, 503} {
		f.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(code)
			io.WriteString(w, internalDetail+strings.Repeat("frame\n", 2000))
		})
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "X-Request-Id", "req-5xx")
		if resp.StatusCode != code || resp.Header.Get("Retry-After") != "3" {
			t.Errorf("%d: status %d, Retry-After %q; want the worker's", code, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		e := decodeError(t, resp)
		for _, leak := range []string{"10.0.3.17", "gpu-17", "Traceback", "/opt/vllm", "CUDA"} {
			if strings.Contains(e.Message, leak) {
				t.Errorf("%d: the client saw %q: %q", code, leak, e.Message)
			}
		}
		if !strings.Contains(e.Message, "req-5xx") || e.Type != "server_error" {
			t.Errorf("%d: error %+v, want a server_error naming the request id", code, e)
		}
	}
	g.waitDone(t, 2)
	log := logs.String()
	if !strings.Contains(log, "gpu-17.internal") || !strings.Contains(log, "req-5xx") {
		t.Errorf("the log lacks the worker's text or the request id:\n%s", log)
	}
	// Two answers of 12 KB each, 1 KiB of each logged: about 170 frames apiece.
	if n := strings.Count(log, "frame"); n == 0 || n > 2*1024/len("frame\n") {
		t.Errorf("the log holds %d frames of the worker's 2 × 2,000, want a bounded part", n)
	}

	const validation = `{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, validation)
	})
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || string(body) != validation {
		t.Errorf("a 400 from the engine: %d %q, want it as the engine sent it", resp.StatusCode, body)
	}
}

// TestStreamIdleTimeout: a stream on which the worker goes silent ends after the idle bound with
// an OpenAI-shaped SSE error event and [DONE], the worker's request is cancelled, and the metric
// counts it; a stream whose events keep coming is not cut, however long it takes in all.
//
// It runs in a synctest bubble on an in-memory network: the bound is measured on the bubble's
// clock, to the nanosecond, and the steady stream's gaps can sit just under the bound without a
// loaded machine's stall cutting it.
func TestStreamIdleTimeout(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const idle = 300 * time.Millisecond
		f := newFakeWorkerOn(t, mn, "m")
		released := make(chan struct{}, 1)
		f.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[]}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done() // a hung engine: nothing more until the gateway lets go
			released <- struct{}{}
		})
		cfg := Config{}
		cfg.Proxy.StreamIdleTimeout = idle
		g := newTestGatewayOn(t, mn, cfg, "round_robin", f)

		start := time.Now()
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x","stream":true}`)
		events := sseLines(resp)
		if took := time.Since(start); took != idle {
			t.Errorf("the silent stream ended after %v, want %v", took, idle)
		}
		if len(events) != 3 || !strings.Contains(events[1], `"code":"stream_idle_timeout"`) || !strings.Contains(events[1], `"type":"server_error"`) || events[2] != "data: [DONE]" {
			t.Fatalf("events %q, want the worker's one, an idle-timeout error, [DONE]", events)
		}
		testutil.Recv(t, released, "the worker's request to be cancelled")
		g.waitDone(t, 1)
		want := `kvgate_upstream_errors_total{kind="stream_idle",worker="` + g.reg.View().All[0].ID + `"} 1`
		if m := scrape(t, g); !strings.Contains(m, want) {
			t.Errorf("the metrics lack %s", want)
		}

		// Sixty events nine tenths of the bound apart: 54 bounds in all, never idle for one.
		const gap, n = idle * 9 / 10, 60
		steady := newFakeWorkerOn(t, mn, "m")
		steady.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for range n {
				io.WriteString(w, "data: {\"choices\":[]}\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-time.After(gap):
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, "data: [DONE]\n\n")
		})
		sg := newTestGatewayOn(t, mn, cfg, "round_robin", steady)
		start = time.Now()
		events = sseLines(sg.post(t, "/v1/completions", `{"model":"m","prompt":"x","stream":true}`))
		if len(events) != n+1 || strings.Contains(strings.Join(events, ""), "error") {
			t.Fatalf("a steady stream was cut after %v: %d events, the last %q", time.Since(start), len(events), events[len(events)-1])
		}
		if took := time.Since(start); took != n*gap {
			t.Errorf("the steady stream took %v, want %v", took, n*gap)
		}
	})
}

// sseLines reads resp's body to its end and returns its non-empty lines.
func sseLines(resp *http.Response) []string {
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// Defect: any byte restarted --stream-idle-timeout, so a worker sending SSE comments only, or one
// byte a second of an event that never ends, held a stream open until --request-timeout (10
// minutes by default). Only a complete data event restarts it now: both streams end at the
// bound after the last complete event (on a synctest bubble's clock), with the SSE error event,
// and the client never sees the partial event.
func TestStreamIdleCountsEvents(t *testing.T) {
	const idle = 400 * time.Millisecond
	for name, tick := range map[string]string{
		"comments only":           ": keep-alive\n\n",
		"events without data":     "event: ping\n\n",
		"a trickle of one event":  "x",
		"a partial event, a line": "data: {\"choices\":[]}\n",
	} {
		t.Run(name, func(t *testing.T) {
			testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
				f := newFakeWorkerOn(t, mn, "m")
				f.setHandler(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: {\"choices\":[]}\n\n")
					if tick == "x" {
						io.WriteString(w, "data: {")
					}
					w.(http.Flusher).Flush()
					tk := time.NewTicker(idle / 8)
					defer tk.Stop()
					for {
						select {
						case <-r.Context().Done():
							return
						case <-tk.C:
							io.WriteString(w, tick)
							w.(http.Flusher).Flush()
						}
					}
				})
				cfg := Config{}
				cfg.Proxy.StreamIdleTimeout = idle
				cfg.Proxy.RequestTimeout = 10 * idle // without the idle bound, the stream ends here
				g := newTestGatewayOn(t, mn, cfg, "round_robin", f)
				start := time.Now()
				resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x","stream":true}`)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(string(body), `"code":"stream_idle_timeout"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
					t.Fatalf("the stream ended without the idle error event: %q", body)
				}
				if took := time.Since(start); took != idle {
					t.Errorf("the stream ended after %v, want %v", took, idle)
				}
				if tick == "x" && strings.Contains(string(body), "data: {x") {
					t.Errorf("the client saw the partial event: %q", body)
				}
			})
		})
	}
}
