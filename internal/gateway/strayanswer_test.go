package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	kvtestutil "github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// doublingWorker is a raw-TCP worker (model "dup") that answers every request twice, the second
// copy written only once the next request on the connection has arrived: the worst case of a
// worker without TCP_NODELAY (Nagle and delayed ACKs hold the copy until the next request is
// already waiting), made deterministic. No HTTP/1.1 client can tell that copy from the answer to
// the next request; only the request id can. echo says how the worker echoes the id it was sent:
// "header" (a response X-Request-Id), "body" (the answer's id is cmpl-<id>, as vLLM's), "none".
type doublingWorker struct {
	url     string
	echo    string
	nodelay bool
	conns   atomic.Int32
}

func newDoublingWorker(t *testing.T, echo string, nodelay bool) *doublingWorker {
	t.Helper()
	dw := &doublingWorker{echo: echo, nodelay: nodelay}
	dw.url = rawWorker(t, func(c net.Conn) {
		dw.conns.Add(1)
		_ = c.(*net.TCPConn).SetNoDelay(nodelay)
		dw.serve(c)
	})
	return dw
}

// serve answers one connection's requests, each answer followed by a copy of it when the next
// request arrives.
func (dw *doublingWorker) serve(c net.Conn) {
	br := bufio.NewReader(c)
	var previous string
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		if err != nil {
			return
		}
		if req.Method == http.MethodGet {
			out := `{"object":"list","data":[{"id":"dup","object":"model","owned_by":"vllm"}]}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
			continue
		}
		var in struct {
			Prompt string `json:"prompt"`
			Stream bool   `json:"stream"`
		}
		_ = json.Unmarshal(body, &in)
		rid := req.Header.Get("X-Request-Id")
		id, extra := fmt.Sprintf("cmpl-%d-%d", dw.conns.Load(), n), ""
		switch dw.echo {
		case "header":
			extra = "X-Request-Id: " + rid + "\r\n"
		case "body":
			id = "cmpl-" + rid
		}
		ct, out := "application/json", `{"id":"`+id+`","object":"text_completion","prompt":"`+in.Prompt+`"}`
		if in.Stream {
			ct, out = "text/event-stream", "data: "+out+"\n\ndata: [DONE]\n\n"
		}
		answer := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%sContent-Length: %d\r\n\r\n%s", ct, extra, len(out), out)
		if previous != "" {
			io.WriteString(c, previous) // the stray: the previous request's answer, once more
		}
		io.WriteString(c, answer)
		previous = answer
	}
}

// promptOf is the prompt a doubling worker's answer (whole or streamed) says it answered.
func promptOf(body string) string {
	body = strings.TrimPrefix(body, "data: ")
	if i := strings.Index(body, "\n"); i >= 0 {
		body = body[:i]
	}
	var a struct {
		Prompt string `json:"prompt"`
	}
	if json.Unmarshal([]byte(body), &a) != nil {
		return ""
	}
	return a.Prompt
}

// Defect: a worker that sends one well-formed answer too many shifted every later answer on that
// connection by one: 200 of 200 sequential clients each got the previous client's answer, and
// tens of concurrent ones. Every attempt now carries the gateway's own request id; a worker that
// echoes it (in a header, or in the answer's id as vLLM does) has each answer checked against its
// request, and a stray closes its connection and sends the attempt again on a new one. A worker
// that echoes nothing is safe with --worker-conn-reuse never. With TCP_NODELAY or without, no
// client gets another's answer, and every one gets its own.
func TestStrayAnswerNeverReachesAnotherClient(t *testing.T) {
	never := func(*worker.Worker) bool { return false }
	for _, c := range []struct {
		echo          string
		never         bool
		users, each   int
		stream, delay bool
	}{
		{echo: "header", users: 1, each: 60},
		{echo: "header", users: 1, each: 30, delay: true},
		{echo: "body", users: 1, each: 60},
		{echo: "body", users: 1, each: 30, stream: true},
		{echo: "header", users: 8, each: 15},
		{echo: "body", users: 8, each: 15, delay: true},
		{echo: "body", users: 8, each: 10, stream: true},
		{echo: "none", never: true, users: 1, each: 30},
		{echo: "none", never: true, users: 8, each: 10},
	} {
		name := fmt.Sprintf("echo %s, %dx%d, stream %v, nagle %v, never reuse %v", c.echo, c.users, c.each, c.stream, c.delay, c.never)
		t.Run(name, func(t *testing.T) {
			cfg := Config{}
			if c.never {
				cfg.Proxy.ConnReuse = never
			}
			cfg.Proxy.Retry.MaxAttempts = 1 // what the attempt relays is what the client sees
			g := newTestGateway(t, cfg, "round_robin")
			dw := newDoublingWorker(t, c.echo, !c.delay)
			if _, err := g.Register(t.Context(), AddWorkerRequest{URL: dw.url}); err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			var foreign, notOwn atomic.Int32
			var wg sync.WaitGroup
			for u := range c.users {
				wg.Go(func() {
					for i := range c.each {
						p := fmt.Sprintf("u%d-%d", u, i)
						body := fmt.Sprintf(`{"model":"dup","prompt":%q,"stream":%v}`, p, c.stream)
						resp, err := client.Post(g.srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
						if err != nil {
							notOwn.Add(1)
							continue
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						got := promptOf(string(b))
						if got != "" && got != p {
							foreign.Add(1)
						}
						if resp.StatusCode != http.StatusOK || got != p {
							notOwn.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if n := foreign.Load(); n > 0 {
				t.Errorf("%d of %d clients got another client's answer", n, c.users*c.each)
			}
			if n := notOwn.Load(); n > 0 {
				t.Errorf("%d of %d clients did not get their own answer", n, c.users*c.each)
			}
			strays := testutil.CollectAndCount(g.metrics.hostile.strays)
			if c.echo != "none" && c.users*c.each > 1 && strays == 0 {
				t.Errorf("kvgate_upstream_stray_answers_total is 0; the worker sent a stray for every reused connection")
			}
		})
	}
}

// What llm-d-inference-sim echoes of the gateway's request id, and so what binds its answers:
// with --enable-request-id-headers, a response X-Request-Id (and the answer's id); without, a
// random answer id, so the gateway learns that it does not echo and relays its answers as they
// are (docs/security.md: such a worker needs --worker-conn-reuse never to be safe from strays).
func TestLLMDSimRequestIDEcho(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  worker.Echo
	}{
		{[]string{"--enable-request-id-headers"}, worker.EchoHeader},
		{nil, worker.EchoNone},
	} {
		t.Run(fmt.Sprint(c.flags), func(t *testing.T) {
			sim := kvtestutil.StartLLMDSim(t, "m", c.flags...)
			g := newTestGateway(t, Config{}, "round_robin")
			w, err := g.Register(t.Context(), AddWorkerRequest{URL: sim.URL})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				stream := i%2 == 1
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi %d"}],"max_tokens":2,"stream":%v}`, i, stream)
				resp, err := http.Post(g.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "chatcmpl-") {
					t.Fatalf("answer %d: %d %q", i, resp.StatusCode, b)
				}
			}
			if got := w.Echo(); got != c.want {
				t.Errorf("learned echo %b, want %b", got, c.want)
			}
			if n := testutil.CollectAndCount(g.metrics.hostile.strays); n != 0 {
				t.Errorf("%d strays counted from an honest engine", n)
			}
		})
	}
}

// A conn_reuse label other than always or never is refused at registration (400).
func TestConnReuseLabelValidated(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	f := newFakeWorker(t, "m")
	resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+f.URL+`","labels":{"conn_reuse":"sometimes"}}`, "")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("conn_reuse=sometimes: %d %s, want 400", resp.StatusCode, raw)
	}
	resp, raw = adminDo(t, g, "POST", "/workers", `{"url":"`+f.URL+`","labels":{"conn_reuse":"never"}}`, "")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("conn_reuse=never: %d %s, want 201", resp.StatusCode, raw)
	}
}

// A worker behind a proxy that sets an X-Request-Id of its own on every answer was never seen
// to echo the gateway's: its answers are not strays, and none is sent twice.
func TestOwnRequestIDIsNoStray(t *testing.T) {
	f := newFakeWorker(t, "m")
	var n atomic.Int32
	f.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", fmt.Sprintf("proxy-%d", n.Add(1)))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","choices":[]}`)
	})
	g := newTestGateway(t, Config{}, "round_robin", f)
	for range 20 {
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if got := n.Load(); got != 20 {
		t.Errorf("the worker saw %d requests for 20 answers", got)
	}
	if c := testutil.CollectAndCount(g.metrics.hostile.strays); c != 0 {
		t.Errorf("%d strays counted", c)
	}
}
