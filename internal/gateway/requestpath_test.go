package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// postBounded posts body to path through g's client bounded by testutil.Deadline, so that a
// request that hangs fails instead of hanging the test.
func (g *testGateway) postBounded(t *testing.T, path, body string) *http.Response {
	t.Helper()
	bounded := *g.client
	bounded.Timeout = testutil.Deadline
	resp, err := bounded.Post(g.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// abortAfter answers with the given content type, writes first, flushes, and then breaks the
// connection mid-body.
func abortAfter(contentType, first string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
}

// TestTruncatedBodyAbortsTheClient: a non-streamed answer that breaks mid-body must not reach
// the client as a clean 200 with half a JSON document; the client's connection is aborted, after
// the books are settled.
func TestTruncatedBodyAbortsTheClient(t *testing.T) {
	fw := newFakeWorker(t, "m")
	fw.setHandler(abortAfter("application/json", `{"id":"c1","object":"chat.completion","choices":[{"index":0,`))
	g := newTestGateway(t, Config{}, "round_robin", fw)
	resp := g.postBounded(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("the client read a clean end after a truncated body: status %d, %q", resp.StatusCode, body)
	}
	g.waitDone(t, 1)
	if n := totalInflight(g.Server); n != 0 {
		t.Errorf("in flight %d after the request", n)
	}
	// Counted once, as the 200 it was answered with.
	wantMetrics(t, g, `# HELP kvgate_requests_total Client requests by route, model and status.
# TYPE kvgate_requests_total counter
kvgate_requests_total{model="m",route="/v1/chat/completions",status="200"} 1
`, "kvgate_requests_total")
}

// sseEvents splits an SSE body into its data payloads and fails on any that is neither [DONE]
// nor a JSON object: what a strict client (the OpenAI SDKs) would choke on.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	for _, ev := range strings.Split(strings.TrimSpace(body), "\n\n") {
		data := strings.TrimPrefix(ev, "data: ")
		if data != "[DONE]" && !json.Valid([]byte(data)) {
			t.Errorf("event %q is not valid JSON; stream:\n%s", ev, body)
		}
		out = append(out, data)
	}
	return out
}

// TestStreamCutMidEventShowsNoPartialEvent: when a stream breaks in the middle of an event, the
// client gets the complete events, then an error event, then [DONE]; never the half event.
func TestStreamCutMidEventShowsNoPartialEvent(t *testing.T) {
	fw := newFakeWorker(t, "m")
	fw.setHandler(abortAfter("text/event-stream", "data: {\"n\":1}\n\ndata: {\"n\":2,\"choi"))
	g := newTestGateway(t, Config{}, "round_robin", fw)
	resp := g.postBounded(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("a streamed answer ends with an error event, not a cut connection: %v", err)
	}
	evs := sseEvents(t, string(body))
	if len(evs) != 3 || evs[0] != `{"n":1}` || !strings.Contains(evs[1], `"code":"upstream_stream_broken"`) || evs[2] != "[DONE]" {
		t.Errorf("events %q; want the complete event, the error event and [DONE]", evs)
	}
}

// TestStreamedAnswerFlushedWhateverItsContentType: a worker that streams with another content
// type than text/event-stream still reaches the client chunk by chunk.
func TestStreamedAnswerFlushedWhateverItsContentType(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	fw := newFakeWorker(t, "m")
	fw.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	g := newTestGateway(t, Config{}, "round_robin", fw)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first chunk %q, %v: it was held back until the stream ended", line, err)
	}
}

// TestMidStreamRequestTimeoutIsNotTheWorkersFault: a stream still flowing when --request-timeout
// ends is cut with a timeout error event, and the worker's breaker does not hear of it. The
// worker's first event must reach the client within the timeout: 3 s against milliseconds (with
// 1 s, a loaded machine that held that event back as long made the answer a bare 504).
func TestMidStreamRequestTimeoutIsNotTheWorkersFault(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const timeout = 3 * time.Second
		fw := newFakeWorkerOn(t, mn, "m")
		fw.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"n\":1}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		})
		g := newTestGatewayOn(t, mn, Config{Proxy: proxyTimeout(timeout), Breaker: worker.BreakerConfig{FailureThreshold: 1}}, "round_robin", fw)
		start := time.Now()
		resp := g.postBounded(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if took := time.Since(start); took != timeout {
			t.Errorf("the stream ended after %v, want the request timeout %v", took, timeout)
		}
		evs := sseEvents(t, string(body))
		if len(evs) != 3 || !strings.Contains(evs[1], `"code":"request_timeout"`) {
			t.Errorf("events %q; want the event, a request_timeout error and [DONE]", evs)
		}
		g.waitDone(t, 1)
		if st := g.reg.View().All[0].Breaker.State(time.Now()); st != worker.Closed {
			t.Errorf("the circuit is %s: a long answer was counted as the worker's failure", st)
		}
	})
}

// TestPrefillRequestHasADeadline: a hung prefill worker holds the client no longer than the
// request timeout (to the nanosecond, on a synctest bubble's clock).
func TestPrefillRequestHasADeadline(t *testing.T) {
	testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) {
		const timeout = 500 * time.Millisecond
		p, d := newFakeWorkerOn(t, mn, "m"), newFakeWorkerOn(t, mn, "m")
		p.setHandler(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		g := newTestGatewayOn(t, mn, Config{Proxy: proxyTimeout(timeout)}, "round_robin")
		g.mustRegister(t, AddWorkerRequest{URL: p.URL, WorkerType: "prefill"}, AddWorkerRequest{URL: d.URL, WorkerType: "decode"})
		start := time.Now()
		resp := g.postBounded(t, "/generate", `{"text":"hi"}`)
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		g.waitDone(t, 1)
		if el := time.Since(start); el != timeout {
			t.Errorf("the request took %v with a %v request timeout", el, timeout)
		}
		if n := totalInflight(g.Server); n != 0 {
			t.Errorf("in flight %d", n)
		}
	})
}

// TestPrefillWithoutDecodeIs503: during a rollout a model may have prefill workers and no decode
// workers yet; requests get a 503 that says so.
func TestPrefillWithoutDecodeIs503(t *testing.T) {
	p := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin")
	g.mustRegister(t, AddWorkerRequest{URL: p.URL, WorkerType: "prefill"})
	resp := g.postBounded(t, "/generate", `{"text":"hi"}`)
	if e := wantError(t, resp, http.StatusServiceUnavailable); !strings.Contains(e.Message, "decode") {
		t.Errorf("message %q does not say decode workers are missing", e.Message)
	}
}

// TestQueryStringForwarded: the client's query string reaches the worker.
func TestQueryStringForwarded(t *testing.T) {
	fw := newFakeWorker(t, "m")
	got := make(chan string, 1)
	fw.setHandler(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.RawQuery
		defaultInference(w, r)
	})
	g := newTestGateway(t, Config{}, "round_robin", fw)
	resp := g.postBounded(t, "/v1/chat/completions?api-version=2024-06-01&x=a%20b", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if q := <-got; q != "api-version=2024-06-01&x=a%20b" {
		t.Errorf("worker saw query %q", q)
	}
}
