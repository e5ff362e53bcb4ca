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

	"github.com/kvgate/kvgate/internal/testutil"
)

// The malicious-worker suite: a worker on a raw TCP socket that breaks HTTP/1.1 framing the ways
// a buggy or hostile engine does, in front of a gateway that also serves an honest worker. Each
// case asserts what a client must never see (another client's answer, a worker's internals) and
// that the clients after it are served as usual; TestMaliciousWorkerSuite runs them all with the
// gateway's heap measured.

// strayAnswer is 40 bytes that parse as a complete HTTP/1.1 answer. A worker that sends it after
// a finished answer, on a connection the gateway pooled, offers every later request on that
// connection the answer before its own. Its "garbage" mode sends 40 bytes that do not parse.
const strayAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nst"

// badWorker is a raw-TCP worker serving model "bad". A POST's prompt is "<mode> <id>"; an
// ordinary answer is {"id":"<id>"}, and mode says what the worker does wrong around it.
type badWorker struct {
	url   string
	conns atomic.Int32
	// lateEnded receives once for each connection on which the worker wrote a stray answer or
	// a 408 after an answer, when the gateway has closed that connection (it saw the bytes
	// arrive on an idle connection). It holds up to 64; the worker never waits on it.
	lateEnded chan struct{}
}

func newBadWorker(t *testing.T) *badWorker {
	t.Helper()
	bw := &badWorker{lateEnded: make(chan struct{}, 64)}
	bw.url = rawWorker(t, func(c net.Conn) {
		bw.conns.Add(1)
		if bw.serve(c) {
			select {
			case bw.lateEnded <- struct{}{}:
			default:
			}
		}
	})
	return bw
}

// serve answers the requests of one connection until it breaks or a mode ends it. It reports
// whether it wrote a stray answer or a 408 after an answer on it.
func (bw *badWorker) serve(c net.Conn) (late bool) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return late
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		if err != nil {
			return late
		}
		if req.Method == http.MethodGet {
			out := `{"object":"list","data":[{"id":"bad","object":"model","owned_by":"sglang"}]}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
			continue
		}
		var in struct {
			Prompt string `json:"prompt"`
		}
		_ = json.Unmarshal(body, &in)
		mode, id, _ := strings.Cut(in.Prompt, " ")
		answer := `{"id":"` + id + `"}`
		ok := func(extra string) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(answer), answer)
		}
		switch mode {
		case "stray":
			ok("")
			time.Sleep(40 * time.Millisecond) // the worker's bug: 40 bytes more, 40 ms later
			io.WriteString(c, strayAnswer)
			late = true
		case "short":
			// The declared length is 40 bytes short of what follows, a moment later.
			ok("")
			time.Sleep(time.Millisecond)
			io.WriteString(c, strings.Repeat("X", 40))
		case "long":
			// The declared length is 40 bytes more than the worker sends before it closes.
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer)+40, answer)
			time.Sleep(40 * time.Millisecond)
			return
		case "cut":
			// The header promises a body that never comes.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
			return
		case "408":
			// A server that times its idle connections out with a 408 before it closes them.
			// It closes its side after the 408 and waits for the gateway to close the other, so
			// that a test can tell when the gateway has seen both.
			ok("")
			time.Sleep(40 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, io.LimitReader(br, 1<<20))
			return true
		case "hop", "hopclose":
			conn := "keep-alive"
			if mode == "hopclose" {
				conn = "close"
			}
			ok("Connection: " + conn + ", Cache-Control, X-Ratelimit-Remaining-Requests\r\n" +
				"Cache-Control: private\r\nX-Ratelimit-Remaining-Requests: 7\r\nX-Ratelimit-Limit-Requests: 100\r\n" +
				"Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nUpgrade: h2c\r\nTrailer: X-T\r\n" +
				"Server: vllm-internal/10.0.3.17\r\nSet-Cookie: session=worker\r\nX-Internal-Host: 10.0.3.17\r\n" +
				"Strict-Transport-Security: max-age=1\r\nAlt-Svc: h3=\":443\"\r\nLink: <http://10.0.3.17/x>\r\n" +
				"Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Credentials: true\r\n")
			if mode == "hopclose" {
				return
			}
		default:
			ok("")
		}
	}
}

// clientAnswer is what one client got.
type clientAnswer struct {
	status  int
	header  http.Header
	body    string
	readErr error
}

// ask sends one completion request for model with prompt to the gateway at base.
func ask(t *testing.T, c *http.Client, base, model, prompt string) clientAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return clientAnswer{readErr: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return clientAnswer{status: resp.StatusCode, header: resp.Header, body: string(b), readErr: err}
}

// answerID is the id of an ordinary answer, "" for anything else.
func answerID(body string) string {
	var a struct {
		ID string `json:"id"`
	}
	if json.Unmarshal([]byte(body), &a) != nil {
		return ""
	}
	return a.ID
}

// maliciousGateway is a gateway in front of a bad worker (model "bad") and an honest one
// (model "good"), with a client of its own.
type maliciousGateway struct {
	*testGateway
	bad    *badWorker
	client *http.Client
}

func newMaliciousGateway(t *testing.T, cfg Config) *maliciousGateway {
	t.Helper()
	good := newFakeWorker(t, "good")
	bad := newBadWorker(t)
	// No retries: every attempt's answer is what its client sees.
	cfg.Proxy.Retry.MaxAttempts = 1
	g := newTestGateway(t, cfg, "round_robin", good)
	if _, err := g.Register(t.Context(), AddWorkerRequest{URL: bad.url}); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &maliciousGateway{testGateway: g, bad: bad, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// honest checks that the honest worker's model is served meanwhile.
func (m *maliciousGateway) honest(t *testing.T) {
	t.Helper()
	if a := ask(t, m.client, m.srv.URL, "good", "hi"); a.status != http.StatusOK || a.readErr != nil {
		t.Errorf("the honest worker's model: %d %v %q", a.status, a.readErr, a.body)
	}
}

// TestWorkerStrayBytesNeverReachAnotherClient: a worker that sends 40 stray bytes 40 ms after
// each complete answer never makes a later client get an earlier client's answer: every client
// gets its own. The strays parse as a complete answer (each client after the gateway has seen
// the stray before it), or do not (clients 10 ms apart, then eight users at once).
//
// What no HTTP/1.1 client can tell apart: a stray that parses as a complete answer, arriving
// while the next request on that connection waits for its answer, is that answer; the worker's
// real answer then follows, and the connection's next request may take it. net/http closes a
// connection on which bytes arrive while it is idle, which ends the shift at once when requests
// come one at a time; docs/security.md says what remains with many at once. The well-formed
// case therefore waits, before each next client, for the gateway to close the connection the
// stray arrived on: a fixed pause would race the worker's 40 ms on a loaded machine, and the
// stray would then arrive while the next request waits, the case the paragraph above excludes.
func TestWorkerStrayBytesNeverReachAnotherClient(t *testing.T) {
	for _, c := range []struct {
		mode        string
		users, each int
		gap         time.Duration // between one client's answer and the next; 0 with seen
		seen        bool          // the next client waits until the gateway closed the stray's connection
	}{
		{"stray", 1, 5, 0, true},
		{"garbage", 1, 30, 10 * time.Millisecond, false},
		{"garbage", 8, 25, 0, false},
	} {
		name := fmt.Sprintf("%s %dx%d every %v", c.mode, c.users, c.each, c.gap)
		if c.seen {
			name = fmt.Sprintf("%s %dx%d each once the stray was seen", c.mode, c.users, c.each)
		}
		t.Run(name, func(t *testing.T) {
			m := newMaliciousGateway(t, Config{})
			var foreign, notOwn atomic.Int32
			var wg sync.WaitGroup
			for u := range c.users {
				wg.Go(func() {
					for i := range c.each {
						id := fmt.Sprintf("u%d-%d", u, i)
						a := ask(t, m.client, m.srv.URL, "bad", c.mode+" "+id)
						if got := answerID(a.body); got != "" && got != id {
							foreign.Add(1)
						}
						if a.status != http.StatusOK || answerID(a.body) != id {
							notOwn.Add(1)
						}
						if c.seen {
							select {
							case <-m.bad.lateEnded:
							case <-time.After(testutil.Deadline):
								t.Errorf("waited %v for the gateway to close the connection the stray arrived on", testutil.Deadline)
								return
							}
						}
						time.Sleep(c.gap) // the pace of the clients is what the case is about
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
			m.honest(t)
		})
	}
}

// TestWorkerBadContentLength: a body longer than its declared length never reaches the next
// client; a body shorter than declared is never shown as complete (a 502 when it fits the relay's
// buffer or nothing of it reached the client, an aborted connection otherwise); the client after
// either gets its answer.
func TestWorkerBadContentLength(t *testing.T) {
	m := newMaliciousGateway(t, Config{})
	for i := range 5 {
		if a := ask(t, m.client, m.srv.URL, "bad", fmt.Sprintf("short s%d", i)); a.status != http.StatusOK || answerID(a.body) != fmt.Sprintf("s%d", i) {
			t.Errorf("short %d: %d %q", i, a.status, a.body)
		}
		id := fmt.Sprintf("next%d", i)
		if a := ask(t, m.client, m.srv.URL, "bad", "ok "+id); a.status != http.StatusOK || answerID(a.body) != id {
			t.Errorf("the client after a long body: %d %q %v, want its own answer", a.status, a.body, a.readErr)
		}
	}
	// A whole answer that fits the relay's buffer is read whole before it is committed: cut
	// short, it is a 502 (a longer one ends the client's connection instead).
	a := ask(t, m.client, m.srv.URL, "bad", "long l1")
	if a.readErr == nil && (a.status != http.StatusBadGateway || !strings.Contains(a.body, `"error"`)) {
		t.Errorf("a body cut short of its length reached the client as complete: %d %q", a.status, a.body)
	}
	a = ask(t, m.client, m.srv.URL, "bad", "cut c1")
	if a.status != http.StatusBadGateway || !strings.Contains(a.body, `"error"`) || !strings.Contains(a.body, "request id") {
		t.Errorf("a body cut before its first byte: %d %q %v, want a 502 in OpenAI shape", a.status, a.body, a.readErr)
	}
	if a := ask(t, m.client, m.srv.URL, "bad", "ok after"); a.status != http.StatusOK || answerID(a.body) != "after" {
		t.Errorf("the client after a cut body: %d %q", a.status, a.body)
	}
	m.honest(t)
}

// TestWorkerStray408: a 408 that a worker sends on an idle connection before closing it is
// never a later client's answer: the gateway closes that connection, and the next request goes
// on another. Each next request waits until the gateway has closed it (a fixed pause past the
// worker's 40 ms would, on a loaded machine, let the next request reach the connection first,
// and a 408 that arrives while a request waits is that request's answer in HTTP/1.1).
func TestWorkerStray408(t *testing.T) {
	m := newMaliciousGateway(t, Config{})
	for i := range 5 {
		id := fmt.Sprintf("r%d", i)
		if a := ask(t, m.client, m.srv.URL, "bad", "408 "+id); a.status != http.StatusOK || answerID(a.body) != id {
			t.Errorf("request %d: %d %q %v, want its own answer", i, a.status, a.body, a.readErr)
		}
		testutil.Recv(t, m.bad.lateEnded, "the gateway closing the connection the 408 arrived on")
	}
	m.honest(t)
}

// TestWorkerHopHeaders: hop-by-hop fields, the fields the worker's Connection lists (also when
// it lists close) and everything outside the allow-list stay at the gateway; rate-limit fields
// the worker does not list reach the client.
func TestWorkerHopHeaders(t *testing.T) {
	m := newMaliciousGateway(t, Config{})
	for _, mode := range []string{"hop", "hopclose"} {
		a := ask(t, m.client, m.srv.URL, "bad", mode+" h1")
		if a.status != http.StatusOK || answerID(a.body) != "h1" {
			t.Fatalf("%s: %d %q %v", mode, a.status, a.body, a.readErr)
		}
		for _, k := range []string{"Cache-Control", "X-Ratelimit-Remaining-Requests", "Keep-Alive", "Proxy-Authenticate",
			"Upgrade", "Trailer", "Set-Cookie", "X-Internal-Host", "Strict-Transport-Security", "Alt-Svc", "Link",
			"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials"} {
			if v, ok := a.header[k]; ok {
				t.Errorf("%s: %s: %q reached the client", mode, k, v)
			}
		}
		if s := a.header.Get("Server"); strings.Contains(s, "10.0.3.17") || strings.Contains(s, "vllm") {
			t.Errorf("%s: Server: %q reached the client", mode, s)
		}
		if mode == "hop" && a.header.Get("X-Ratelimit-Limit-Requests") != "100" {
			t.Errorf("%s: X-Ratelimit-Limit-Requests %q, want the worker's 100", mode, a.header.Get("X-Ratelimit-Limit-Requests"))
		}
		if a.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: Content-Type %q", mode, a.header.Get("Content-Type"))
		}
	}
	m.honest(t)
}

// TestMaliciousWorkerSuite runs every malicious-worker case against one gateway, with the honest
// worker's clients served alongside, and bounds what the gateway's heap keeps.
func TestMaliciousWorkerSuite(t *testing.T) {
	const budget = 64 << 20
	m := newMaliciousGateway(t, Config{})
	base := heapAlloc()
	stop := make(chan struct{})
	var served, failed atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; i < 500 && time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			default:
			}
			if a := ask(t, m.client, m.srv.URL, "good", "hi"); a.status == http.StatusOK && a.readErr == nil {
				served.Add(1)
			} else {
				failed.Add(1)
			}
		}
	})
	var cases sync.WaitGroup
	for u := range 4 {
		cases.Go(func() {
			for i, mode := range []string{"stray", "short", "long", "cut", "408", "hop", "hopclose", "ok"} {
				ask(t, m.client, m.srv.URL, "bad", fmt.Sprintf("%s u%d-%d", mode, u, i))
			}
		})
	}
	cases.Wait()
	close(stop)
	wg.Wait()
	if grew := int64(heapAlloc()) - int64(base); grew > budget {
		t.Errorf("the gateway's heap grew %d MiB during the malicious worker's cases", grew>>20)
	}
	if served.Load() == 0 || failed.Load() > 0 {
		t.Errorf("honest traffic: %d served, %d failed", served.Load(), failed.Load())
	}
	if n := totalInflight(m.Server); n != 0 {
		t.Errorf("%d requests still counted in flight", n)
	}
}
