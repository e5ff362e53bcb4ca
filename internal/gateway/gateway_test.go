package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

func sdkClient(g *testGateway, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(g.srv.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func TestOpenAIClientThroughGateway(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin", f)
	c := sdkClient(g, "unused")
	ctx := context.Background()

	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := chat.Choices[0].Message.Content; got != "hello world" {
		t.Errorf("chat content = %q", got)
	}

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:  "m",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := comp.Choices[0].Text; got != "hello world" {
		t.Errorf("completion text = %q", got)
	}

	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		chunks++
		if len(stream.Current().Choices) > 0 {
			text.WriteString(stream.Current().Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks != 3 || text.String() != "hello world" {
		t.Errorf("stream: %d chunks, text %q; want 3, \"hello world\"", chunks, text.String())
	}
	if f.requests() != 3 {
		t.Errorf("worker saw %d requests, want 3", f.requests())
	}
}

// TestSSEEventsRelayedOneByOne holds the worker's second event back until the client has read the
// first: a gateway that buffered the stream would never deliver the first event.
func TestSSEEventsRelayedOneByOne(t *testing.T) {
	f := newFakeWorker(t, "m")
	next := make(chan struct{})
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			fl.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	g := newTestGateway(t, Config{}, "round_robin", f)
	resp := g.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		got := make(chan string, 1)
		go func() {
			line, _ := rd.ReadString('\n')
			_, _ = rd.ReadString('\n') // blank separator
			got <- line
		}()
		select {
		case line := <-got:
			if want := fmt.Sprintf("data: {\"n\":%d}\n", i); line != want {
				t.Fatalf("event %d = %q, want %q", i, line, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d was not relayed before the worker sent the next one", i)
		}
		next <- struct{}{}
	}
	rest, _ := io.ReadAll(rd)
	if string(rest) != "data: [DONE]\n\n" {
		t.Errorf("tail = %q", rest)
	}
}

func TestInflightReturnsToZero(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		body    string
		cancel  bool
	}{
		{name: "ok", body: `{"model":"m","prompt":"x"}`},
		{name: "stream", body: `{"model":"m","stream":true,"prompt":"x"}`},
		{name: "worker error", body: `{"model":"m","prompt":"x"}`, handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		}},
		{name: "client bad request", body: `{"model":"m","prompt":"x"}`, handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":"bad"}`, http.StatusBadRequest)
		}},
		{name: "client cancel", body: `{"model":"m","stream":true,"prompt":"x"}`, cancel: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeWorker(t, "m")
			workerCanceled := make(chan struct{})
			arrived := make(chan struct{})
			if tc.cancel {
				f.setHandler(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: {}\n\n")
					w.(http.Flusher).Flush()
					close(arrived)
					<-r.Context().Done()
					close(workerCanceled)
				})
			} else if tc.handler != nil {
				f.setHandler(tc.handler)
			}
			g := newTestGateway(t, Config{}, "round_robin", f)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/v1/completions", strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.cancel {
				testutil.Recv(t, arrived, "the request at the worker")
				if n := totalInflight(g.Server); n != 1 {
					t.Errorf("in flight during the stream = %d, want 1", n)
				}
				// The worker writes nothing after its first event and the gateway's only timer
				// on a stream (the idle bound) is a minute or more, so a cancel that reaches the
				// worker at all within the wait came by the client's connection closing, at
				// once: how fast that is is a machine's speed (logged), not something to bound
				// in wall time here.
				canceledAt := time.Now()
				cancel()
				testutil.Recv(t, workerCanceled, "the client's cancel at the worker")
				t.Logf("cancel reached the worker in %v", time.Since(canceledAt))
			} else {
				_, _ = io.ReadAll(resp.Body)
			}
			resp.Body.Close()
			g.waitDone(t, 1)
			if n := totalInflight(g.Server); n != 0 {
				t.Errorf("in flight after the request = %d, want 0", n)
			}
		})
	}
}

func TestErrorStatuses(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	cases := []struct {
		name   string
		cfg    Config
		setup  func(g *testGateway, f *fakeWorker)
		path   string
		body   string
		hdr    []string
		status int
	}{
		{name: "malformed json", body: `{"model":"m",`, status: 400},
		{name: "not an object", body: `[1,2]`, status: 400},
		{name: "bad messages", body: `{"model":"m","messages":"hi"}`, status: 400},
		{name: "empty body", body: ``, status: 400},
		{name: "too large", cfg: Config{MaxPayloadSize: 64}, body: `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100) + `"}]}`, status: 413},
		{name: "unknown model", body: `{"model":"nope","messages":[]}`, status: 404},
		{name: "unknown route", path: "/v1/nothing", body: `{}`, status: 404},
		{name: "bad api key", cfg: Config{APIKeys: []string{"k"}}, hdr: []string{"Authorization", "Bearer wrong"}, body: `{"model":"m","messages":[]}`, status: 401},
		{name: "no available worker", setup: func(g *testGateway, f *fakeWorker) {
			g.reg.View().All[0].SetHealth(worker.NotReady)
		}, body: `{"model":"m","messages":[]}`, status: 503},
		{name: "every worker unreachable", setup: func(g *testGateway, f *fakeWorker) {
			f.CloseClientConnections()
			f.Listener.Close()
		}, body: `{"model":"m","messages":[]}`, status: 503},
		{name: "upstream transport failure", setup: func(g *testGateway, f *fakeWorker) {
			f.setHandler(func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) })
		}, body: `{"model":"m","messages":[]}`, status: 502},
		{name: "upstream timeout", cfg: Config{Proxy: proxyTimeout(100 * time.Millisecond)}, setup: func(g *testGateway, f *fakeWorker) {
			f.setHandler(hang)
		}, body: `{"model":"m","messages":[]}`, status: 504},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeWorker(t, "m")
			g := newTestGateway(t, tc.cfg, "round_robin", f)
			if tc.setup != nil {
				tc.setup(g, f)
			}
			path := tc.path
			if path == "" {
				path = "/v1/chat/completions"
			}
			resp := g.post(t, path, tc.body, tc.hdr...)
			if resp.StatusCode != tc.status {
				raw, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			e := decodeError(t, resp)
			if want := errorType(tc.status); e.Type != want {
				t.Errorf("error type %q, want %q", e.Type, want)
			}
			if tc.path == "" {
				g.waitDone(t, 1)
				if n := totalInflight(g.Server); n != 0 {
					t.Errorf("in flight = %d after the error", n)
				}
			}
		})
	}
}

func TestConcurrencyLimit429(t *testing.T) {
	f := newFakeWorker(t, "m")
	arrived, release := f.hold(t)
	g := newTestGateway(t, Config{MaxConcurrentRequests: 1}, "round_robin", f)
	first := g.async(t.Context(), "/v1/completions", `{"model":"m","prompt":"x"}`)
	testutil.Recv(t, arrived, "the first request at the worker")
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	wantError(t, resp, http.StatusTooManyRequests)
	close(release)
	if s := answerStatus(t, first); s != 200 {
		t.Errorf("first request: status %d", s)
	}
}

func TestModelRouting(t *testing.T) {
	a, b := newFakeWorker(t, "alpha"), newFakeWorker(t, "beta")
	g := newTestGateway(t, Config{}, "round_robin", a, b)
	for _, m := range []string{"alpha", "beta", "alpha"} {
		resp := g.post(t, "/v1/completions", `{"model":"`+m+`","prompt":"x"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if a.requests() != 2 || b.requests() != 1 {
		t.Errorf("alpha got %d, beta %d; want 2 and 1", a.requests(), b.requests())
	}
	resp := g.post(t, "/v1/completions", `{"prompt":"x"}`)
	if resp.StatusCode != 400 {
		t.Errorf("no model with two models served: %d, want 400", resp.StatusCode)
	}
	decodeError(t, resp)

	mresp, err := http.Get(g.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct{ ID, Object string }
	}
	json.NewDecoder(mresp.Body).Decode(&list)
	mresp.Body.Close()
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "alpha" || list.Data[1].ID != "beta" || list.Data[0].Object != "model" {
		t.Errorf("/v1/models = %+v", list)
	}
}

func TestSingleModelWithoutModelField(t *testing.T) {
	f := newFakeWorker(t, "only")
	g := newTestGateway(t, Config{}, "random", f)
	resp := g.post(t, "/generate", `{"text":"hello","sampling_params":{"max_new_tokens":4}}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || f.requests() != 1 {
		t.Fatalf("status %d, worker requests %d", resp.StatusCode, f.requests())
	}
}

func TestForwardedHeaders(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin", f)
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "Connection", "X-Secret", "X-Secret", "s", "X-Custom", "c")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	if len(id) != 24 {
		t.Fatalf("generated request id %q", id)
	}
	h := f.headers[0]
	// The worker sees the attempt's own id, which binds its answer (proxy/bind.go), not the client's.
	if wid := h.Get("X-Request-Id"); wid == id || !strings.HasPrefix(wid, "kvg-") {
		t.Errorf("worker saw request id %q, client %q; want the attempt's own", wid, id)
	}
	if h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", h.Get("X-Forwarded-For"))
	}
	if h.Get("X-Secret") != "" {
		t.Error("a header named in Connection was forwarded")
	}
	if h.Get("X-Custom") != "c" {
		t.Error("an end-to-end header was dropped")
	}
	resp = g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`, "X-Request-Id", "mine-1")
	resp.Body.Close()
	if resp.Header.Get("X-Request-Id") != "mine-1" || f.headers[1].Get("X-Request-Id") == "mine-1" {
		t.Error("a client request id was not kept for the client, or was what bound the worker's answer")
	}
}

// The gateway's readiness does not follow its workers: with none ready it stays in the Service,
// and clients get the 503 JSON rather than connection errors. /readiness/workers is the probe
// that follows them.
func TestReadiness(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(g.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.StatusCode, body
	}
	if code, body := get("/readiness"); code != 200 || body["workers_ready"] != false || body["reason"] != "no workers are registered" {
		t.Errorf("readiness with no workers: %d %v, want 200 saying no worker is ready", code, body)
	}
	if code, body := get("/readiness/workers"); code != 503 || body["status"] != "not_ready" {
		t.Errorf("worker readiness with no workers: %d %v, want 503", code, body)
	}
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
	if e := decodeError(t, resp); resp.StatusCode != 503 || e.Code != "no_available_worker" {
		t.Errorf("a request with no workers: %d %+v, want the 503 JSON", resp.StatusCode, e)
	}
	f := newFakeWorker(t, "m")
	w, err := g.Register(context.Background(), AddWorkerRequest{URL: f.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/readiness", "/readiness/workers"} {
		if code, body := get(p); code != 200 || body["ready_workers"] != float64(1) || body["workers_ready"] != true {
			t.Errorf("%s: %d %v", p, code, body)
		}
	}
	w.SetHealth(worker.NotReady)
	if code, body := get("/readiness"); code != 200 || body["workers_ready"] != false || body["reason"] != "no worker is ready" {
		t.Errorf("readiness with its worker down: %d %v, want 200", code, body)
	}
	if code, _ := get("/readiness/workers"); code != 503 {
		t.Errorf("worker readiness with its worker down: %d, want 503", code)
	}
	for _, p := range []string{"/health", "/liveness"} {
		resp, _ = http.Get(g.srv.URL + p)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
}

func TestDisaggregatedPair(t *testing.T) {
	p, d := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	p.setHandler(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"prefill":true}`) })
	d.setHandler(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"decode":true}`) })
	g := newTestGateway(t, Config{}, "round_robin")
	port := 8998
	g.mustRegister(t, AddWorkerRequest{URL: p.URL, WorkerType: "prefill", BootstrapPort: &port})
	g.mustRegister(t, AddWorkerRequest{URL: d.URL, WorkerType: "decode"})
	resp := g.post(t, "/generate", `{"text":"hi","stream":false}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(raw) != `{"decode":true}` {
		t.Fatalf("client got %s, want the decode worker's answer", raw)
	}
	g.waitDone(t, 1)
	var pb, db map[string]any
	json.Unmarshal(p.bodies[0], &pb)
	json.Unmarshal(d.bodies[0], &db)
	if pb["bootstrap_host"] != "127.0.0.1" || pb["bootstrap_port"] != float64(8998) || pb["text"] != "hi" {
		t.Errorf("prefill body %v", pb)
	}
	if pb["bootstrap_room"] == nil || pb["bootstrap_room"] != db["bootstrap_room"] {
		t.Errorf("rooms differ: %v vs %v", pb["bootstrap_room"], db["bootstrap_room"])
	}
	if totalInflight(g.Server) != 0 {
		t.Error("in flight not zero")
	}
}

// TestDisaggregatedPrefillFailure: when the prefill worker fails, the decode worker (which would
// wait for a KV transfer that never comes) is cancelled at once and the client gets a 502.
func TestDisaggregatedPrefillFailure(t *testing.T) {
	p, d := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	decodeArrived, decodeCanceled := make(chan struct{}), make(chan struct{})
	p.setHandler(func(w http.ResponseWriter, r *http.Request) {
		// Fail once the decode request is running, so that there is one to cancel.
		select {
		case <-decodeArrived:
		case <-r.Context().Done():
		}
		http.Error(w, "prefill broke", http.StatusInternalServerError)
	})
	d.setHandler(func(w http.ResponseWriter, r *http.Request) {
		close(decodeArrived)
		<-r.Context().Done()
		close(decodeCanceled)
	})
	g := newTestGateway(t, Config{}, "round_robin")
	g.mustRegister(t, AddWorkerRequest{URL: p.URL, WorkerType: "prefill"})
	g.mustRegister(t, AddWorkerRequest{URL: d.URL, WorkerType: "decode"})
	resp := g.post(t, "/generate", `{"text":"hi"}`)
	if e := wantError(t, resp, http.StatusBadGateway); !strings.Contains(e.Message, "prefill") {
		t.Errorf("message %q does not name the prefill failure", e.Message)
	}
	select {
	case <-decodeCanceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the decode request was not cancelled")
	}
	g.waitDone(t, 1)
	if n := totalInflight(g.Server); n != 0 {
		t.Errorf("in flight %d", n)
	}
}
