package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawAnswerWorker is a raw-TCP worker (model "raw") that answers every POST with the bytes of
// answer (status line and header fields; the blank line and a small body are added), then closes
// the connection. set changes what it answers.
type rawAnswerWorker struct {
	url    string
	mu     sync.Mutex
	answer string
}

func (rw *rawAnswerWorker) set(a string) {
	rw.mu.Lock()
	rw.answer = a
	rw.mu.Unlock()
}

func newRawAnswerWorker(t testing.TB) *rawAnswerWorker {
	rw := &rawAnswerWorker{}
	rw.url = rawWorker(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
			if req.Method == http.MethodGet {
				out := `{"object":"list","data":[{"id":"raw","object":"model"}]}`
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(out))+"\r\n\r\n"+out)
				continue
			}
			rw.mu.Lock()
			a := rw.answer
			rw.mu.Unlock()
			io.WriteString(c, a+"\r\n\r\n"+`{"id":"x"}`)
			return
		}
	})
	return rw
}

// statusSeeds are answers that broke the gateway: statuses 0, 20 and 99 panicked the handler
// (an empty reply), 600 and 999 reached the client as they were, a 101 and a header-only answer
// that closes gave empty replies.
var statusSeeds = []string{
	"HTTP/1.1 000 Zero", "HTTP/1.1 020 Twenty", "HTTP/1.1 099 X", "HTTP/1.1 600 X", "HTTP/1.1 999 X",
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade",
	"HTTP/1.1 102 Processing", "HTTP/1.1 199 X",
	"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 10",
	"HTTP/1.1 200 OK", "HTTP/1.1 200 OK\r\nContent-Length: 10", "HTTP/1.1 200 OK\r\nContent-Length: 400",
	"HTTP/1.1 204 No Content\r\nContent-Length: 10", "HTTP/1.1 500 X\r\nContent-Length: 10",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", "HTTP/1.0 200 OK", "HTTP/1.1 2000 OK", "HTTP/1.1 -1 X",
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream", "HTTP/1.1 304 Not Modified\r\nContent-Length: 10",
}

// checkWorkerStatus asks the gateway once and fails unless the client got a well-formed answer:
// a status line it could read, with a status in 100-599, and for a gateway error (502) the
// OpenAI error shape.
func checkWorkerStatus(t *testing.T, g *testGateway, client *http.Client, answer string) {
	t.Helper()
	resp, err := client.Post(g.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"raw","prompt":"x"}`))
	if err != nil {
		t.Fatalf("worker answer %q: the client got no answer: %v", answer, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode < 100 || resp.StatusCode > 599 {
		t.Fatalf("worker answer %q: the client got status %d", answer, resp.StatusCode)
	}
	if resp.StatusCode == http.StatusBadGateway {
		var e struct {
			Error struct {
				Message, Type string
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("worker answer %q: a 502 not in the OpenAI shape: %q", answer, b)
		}
	}
}

// FuzzWorkerStatusLine sends a client's request to a raw-TCP worker whose answer (status line and
// header fields) is the fuzzer's: whatever it is, the client gets a well-formed answer or a 502 in
// the OpenAI shape, never an empty reply, never a panic. Its seeds run with every go test.
func FuzzWorkerStatusLine(f *testing.F) {
	for _, s := range statusSeeds {
		f.Add(s)
	}
	rw := newRawAnswerWorker(f)
	g := newTestGateway(f, Config{}, "round_robin")
	if _, err := g.Register(f.Context(), AddWorkerRequest{URL: rw.url}); err != nil {
		f.Fatal(err)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	f.Fuzz(func(t *testing.T, answer string) {
		if len(answer) > 4<<10 {
			return
		}
		rw.set(answer)
		checkWorkerStatus(t, g, client, answer)
	})
}

// TestWorkerStatusOutsideTheRange: each status a final answer may not have is a 502 in the
// OpenAI shape, and 1xx and out-of-range statuses are never relayed.
func TestWorkerStatusOutsideTheRange(t *testing.T) {
	rw := newRawAnswerWorker(t)
	g := newTestGateway(t, Config{}, "round_robin")
	if _, err := g.Register(t.Context(), AddWorkerRequest{URL: rw.url}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for _, s := range []string{"000", "020", "099", "101", "102", "199", "600", "999"} {
		rw.set("HTTP/1.1 " + s + " X")
		resp, err := client.Post(g.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"raw","prompt":"x"}`))
		if err != nil {
			t.Fatalf("status %s: %v", s, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("worker status %s: the client got %d, want 502", s, resp.StatusCode)
		}
	}
}
