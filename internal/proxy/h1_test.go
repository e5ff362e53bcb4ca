package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor bounds every wait of these tests on something another goroutine signals.
const waitFor = 10 * time.Second

// h1Post builds a POST to url carrying body the way the Forwarder does: from memory, with a
// GetBody for a second send.
func h1Post(t *testing.T, ctx context.Context, url string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	setBody(req, &Request{Body: body})
	return req
}

// echo answers with what it received: method, target, Host, one header, the body's length and
// hash, in the framing the query asks for.
func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sum := sha256.Sum256(body)
	out := fmt.Sprintf("%s %s host=%s x=%s len=%d sum=%s", r.Method, r.RequestURI, r.Host, r.Header.Get("X-Test"), len(body), hex.EncodeToString(sum[:8]))
	switch r.URL.Query().Get("frame") {
	case "chunked":
		w.Write([]byte(out[:5]))
		w.(http.Flusher).Flush()
		w.Write([]byte(out[5:]))
	case "none":
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.Write([]byte(out))
	}
}

func TestH1SendsRequestsAndReadsAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(echo))
	defer srv.Close()
	tr := &H1{}
	defer tr.CloseIdleConnections()
	for _, size := range []int{0, 1_000, h1BufferSize - 100, 40_000, 1 << 20} {
		for _, frame := range []string{"length", "chunked", "none"} {
			body := bytes.Repeat([]byte("abcdefghij"), size/10+1)[:size]
			req := h1Post(t, context.Background(), srv.URL+"/v1/chat?frame="+frame+"&q=a%20b", body)
			req.Header.Set("X-Test", "v\tw")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("size %d, %s: %v", size, frame, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("size %d, %s: reading: %v", size, frame, err)
			}
			if frame == "none" {
				if resp.StatusCode != http.StatusNoContent || len(got) != 0 {
					t.Fatalf("size %d: %d %q, want an empty 204", size, resp.StatusCode, got)
				}
				continue
			}
			sum := sha256.Sum256(body)
			want := fmt.Sprintf("POST /v1/chat?frame=%s&q=a%%20b host=%s x=v\tw len=%d sum=%s", frame, srv.Listener.Addr(), size, hex.EncodeToString(sum[:8]))
			if string(got) != want {
				t.Fatalf("size %d, %s:\n got %q\nwant %q", size, frame, got, want)
			}
		}
	}
}

// connCounter counts the connections a test server accepts and reports each one it closes.
type connCounter struct {
	opened atomic.Int32
	closed chan struct{}
}

func newCountedServer(t *testing.T, h http.Handler) (*httptest.Server, *connCounter) {
	cc := &connCounter{closed: make(chan struct{}, 64)}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			cc.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			cc.closed <- struct{}{}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cc
}

func TestH1ReusesConnectionsReadToTheEnd(t *testing.T) {
	srv, cc := newCountedServer(t, http.HandlerFunc(echo))
	tr := &H1{}
	defer tr.CloseIdleConnections()
	send := func(readAll bool) {
		resp, err := tr.RoundTrip(h1Post(t, context.Background(), srv.URL+"/?frame=chunked", []byte(`{"a":1}`)))
		if err != nil {
			t.Fatal(err)
		}
		if readAll {
			io.Copy(io.Discard, resp.Body)
		} else {
			resp.Body.Read(make([]byte, 1))
		}
		resp.Body.Close()
	}
	for range 5 {
		send(true)
	}
	if n := cc.opened.Load(); n != 1 {
		t.Fatalf("5 requests read to their end opened %d connections, want 1", n)
	}
	// An answer left unread closes its connection rather than drain it.
	send(false)
	cc.waitClosed(t, "an abandoned answer's connection was not closed")
	send(true)
	if n := cc.opened.Load(); n != 2 {
		t.Fatalf("after an abandoned answer: %d connections opened, want 2", n)
	}
}

// waitClosed waits until the server closes a connection, failing with msg if none does.
func (cc *connCounter) waitClosed(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-cc.closed:
	case <-time.After(waitFor):
		t.Fatal(msg)
	}
}

// idleCount is how many connections tr holds idle.
func idleCount(tr *H1) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.nidle
}

// rawServer runs serve on each connection accepted on a loopback listener.
func rawServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readRequest reads one request and its body from br.
func readRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(req.Body)
	return req, body, err
}

func TestH1ResendsOnAConnectionTheWorkerClosed(t *testing.T) {
	var requests atomic.Int32
	closed := make(chan struct{}, 4)
	// Every connection answers one request as if it stayed open, then closes: the pooled
	// connection is dead by the time the next request takes it.
	url := rawServer(t, func(c net.Conn) {
		defer func() { closed <- struct{}{} }()
		if _, body, err := readRequest(bufio.NewReader(c)); err == nil {
			requests.Add(1)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	tr := &H1{}
	defer tr.CloseIdleConnections()
	for i := range 3 {
		body := []byte(strings.Repeat("x", 100*(i+1)))
		resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Equal(got, body) {
			t.Fatalf("request %d: answer %q, want the body back", i, got)
		}
		select {
		case <-closed:
		case <-time.After(waitFor):
			t.Fatal("the server did not close")
		}
	}
	if n := requests.Load(); n != 3 {
		t.Fatalf("the worker handled %d requests, want 3 (each once)", n)
	}
}

func TestH1CancelBeforeTheAnswer(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	srv, _ := newCountedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		close(arrived)
		<-r.Context().Done() // the gateway closed the connection
		close(gone)
	}))
	tr := &H1{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(h1Post(t, ctx, srv.URL+"/", []byte("{}")))
		errc <- err
	}()
	select {
	case <-arrived:
	case <-time.After(waitFor):
		t.Fatal("the request did not arrive")
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(waitFor):
		t.Fatal("a cancelled request did not return")
	}
	select {
	case <-gone:
	case <-time.After(waitFor):
		t.Fatal("the worker's connection stayed open after the request was cancelled")
	}
}

func TestH1CancelDuringTheAnswer(t *testing.T) {
	release := make(chan struct{})
	srv, cc := newCountedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer close(release)
	tr := &H1{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := tr.RoundTrip(h1Post(t, ctx, srv.URL+"/", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "data: 1") {
		t.Fatalf("first read %q, %v", buf[:n], err)
	}
	cancel()
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, context.Canceled) {
		t.Fatalf("reading after the cancel: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	cc.waitClosed(t, "the connection of a cancelled answer was not closed")
	if n := idleCount(tr); n != 0 {
		t.Fatalf("%d connections pooled after a cancelled answer, want 0", n)
	}
}

func TestH1BoundsTheResponseHeader(t *testing.T) {
	url := rawServer(t, func(c net.Conn) {
		if _, _, err := readRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		for range 200 {
			io.WriteString(c, "X-Filler: "+strings.Repeat("f", 100)+"\r\n")
		}
		io.WriteString(c, "Content-Length: 2\r\n\r\nok")
	})
	tr := &H1{MaxResponseHeaderBytes: 4 << 10}
	_, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", []byte("{}")))
	if !errors.Is(err, errHeaderTooLarge) {
		t.Fatalf("err = %v, want the header bound", err)
	}
	tr = &H1{MaxResponseHeaderBytes: 64 << 10}
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", []byte("{}")))
	if err != nil {
		t.Fatalf("a 20 KB header within a 64 KB bound: %v", err)
	}
	resp.Body.Close()
}

func TestH1SkipsInformationalAnswers(t *testing.T) {
	const many = "HTTP/1.1 100 Continue\r\n\r\n"
	for _, c := range []struct {
		name, answer string
		ok           bool
	}{
		{"100 and 103", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
		{"endless 100", strings.Repeat(many, max1xx+1) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := rawServer(t, func(conn net.Conn) {
				if _, _, err := readRequest(bufio.NewReader(conn)); err == nil {
					io.WriteString(conn, c.answer)
				}
			})
			tr := &H1{}
			defer tr.CloseIdleConnections()
			resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", []byte("{}")))
			if !c.ok {
				if err == nil {
					resp.Body.Close()
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(got) != "ok" {
				t.Fatalf("%d %q, want 200 ok", resp.StatusCode, got)
			}
		})
	}
}

func TestH1RefusesFieldsThatBreakFraming(t *testing.T) {
	var handled atomic.Int32
	srv, _ := newCountedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		echo(w, r)
	}))
	tr := &H1{}
	defer tr.CloseIdleConnections()
	for _, h := range []struct{ k, v string }{
		{"X-Test", "a\r\nX-Injected: 1"},
		{"X-Test", "a\nb"},
		{"X Test", "a"},
		{"X-Test:", "a"},
		{"X-Test", "a\x00"},
	} {
		req := h1Post(t, context.Background(), srv.URL+"/", []byte("{}"))
		req.Header[h.k] = []string{h.v}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%q: %q was sent", h.k, h.v)
		}
		if !errors.Is(err, errBadRequest) {
			t.Fatalf("%q: %q: err = %v, want errBadRequest", h.k, h.v, err)
		}
	}
	// Each was refused before a byte went out, so nothing reached the worker. (A request that
	// did would be handled before the next one's connection is accepted: the check is exact.)
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), srv.URL+"/", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n := handled.Load(); n != 1 {
		t.Fatalf("the worker handled %d requests, want only the valid one", n)
	}
}

func TestH1HandsHTTPSToItsFallback(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(echo))
	defer srv.Close()
	tr := &H1{Fallback: srv.Client().Transport}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), srv.URL+"/x", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(got), "POST /x ") || resp.TLS == nil {
		t.Fatalf("answer %q (TLS %v), want the echo over TLS", got, resp.TLS != nil)
	}
	if _, err := (&H1{}).RoundTrip(h1Post(t, context.Background(), srv.URL+"/x", []byte("{}"))); err == nil {
		t.Fatal("an https request without a fallback was sent")
	}
}

func TestH1ClosesIdleConnections(t *testing.T) {
	srv, cc := newCountedServer(t, http.HandlerFunc(echo))
	tr := &H1{IdleTimeout: 20 * time.Millisecond}
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), srv.URL+"/", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	cc.waitClosed(t, "an idle connection outlived the idle timeout")
	tr.mu.Lock()
	n, armed := tr.nidle, tr.sweeper != nil
	tr.mu.Unlock()
	if n != 0 || armed {
		t.Fatalf("after the sweep: %d idle, sweeper armed %v; want 0, false", n, armed)
	}
}

func TestH1CloseIdleConnections(t *testing.T) {
	srv, cc := newCountedServer(t, http.HandlerFunc(echo))
	tr := &H1{Fallback: NewTransport()}
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), srv.URL+"/", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	tr.CloseIdleConnections()
	cc.waitClosed(t, "CloseIdleConnections left the pooled connection open")
	if n := idleCount(tr); n != 0 {
		t.Fatalf("%d idle after CloseIdleConnections", n)
	}
}

func TestH1ServesAnHTTPClient(t *testing.T) {
	// Health probes go through an http.Client on the same transport: GET, no body, redirects.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/health", http.StatusFound)
			return
		}
		if r.Method != http.MethodGet || r.ContentLength != 0 {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		io.WriteString(w, "healthy")
	}))
	defer srv.Close()
	client := &http.Client{Transport: &H1{}, Timeout: waitFor}
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL + "/old")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != "healthy" {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
}

// captureConn is a connection whose writes land in a buffer.
type captureConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) { return c.buf.Write(p) }

// FuzzH1RequestHeader: whatever header H1 agrees to write parses back, as net/http's server
// reads it, to exactly the fields it was given (no injected field, no lost one).
func FuzzH1RequestHeader(f *testing.F) {
	f.Add("X-Test", "value", "/v1/chat?x=1", "body")
	f.Add("X-Test", "a\r\nX-Injected: 1", "/", "")
	f.Add("Bad Name", "v", "/a b", "x")
	f.Add("X-Tab", "a\tb", "/%20", "{}")
	f.Fuzz(func(t *testing.T, k, v, target, body string) {
		req, err := http.NewRequest(http.MethodPost, "http://worker:8000"+target, nil)
		if err != nil || req.URL.Host != "worker:8000" {
			return
		}
		req.Header[k] = []string{v}
		setBody(req, &Request{Body: []byte(body)})
		cc := &captureConn{}
		c := &h1Conn{nc: cc}
		if err := c.writeRequest(req); err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("a write to memory failed: %v", err)
			}
			return
		}
		got, err := http.ReadRequest(bufio.NewReader(&cc.buf))
		if err != nil {
			t.Fatalf("H1 wrote a request net/http cannot read: %v\n%q", err, cc.buf.String())
		}
		gotBody, err := io.ReadAll(got.Body)
		if err != nil || string(gotBody) != body {
			t.Fatalf("body %q (%v), want %q", gotBody, err, body)
		}
		if got.Host != "worker:8000" || got.RequestURI != req.URL.RequestURI() {
			t.Fatalf("host %q target %q, want worker:8000 %q", got.Host, got.RequestURI, req.URL.RequestURI())
		}
		ck := http.CanonicalHeaderKey(k)
		want := strings.Trim(v, " \t")
		if ownField(ck) {
			if len(got.Header.Values(ck)) > 1 {
				t.Fatalf("H1 sent its own field %q twice", ck)
			}
			return
		}
		if gv := got.Header.Values(ck); len(gv) != 1 || gv[0] != want {
			t.Fatalf("field %q = %q, want [%q]", ck, gv, want)
		}
		if n := len(got.Header); n != 2 { // the fuzzed field and Content-Length
			t.Fatalf("%d fields arrived (%v), want 2", n, got.Header)
		}
	})
}

func TestH1HostPort(t *testing.T) {
	for in, want := range map[string]string{
		"worker":         "worker:80",
		"worker:8000":    "worker:8000",
		"worker:":        "worker:80",
		"10.0.0.1":       "10.0.0.1:80",
		"[::1]":          "[::1]:80",
		"[::1]:8000":     "[::1]:8000",
		"[fe80::1%eth0]": "[fe80::1%eth0]:80",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// recordingTransport answers every request with 200 and remembers that it was asked.
type recordingTransport struct{ asked atomic.Int32 }

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r.asked.Add(1)
	closeRequestBody(req)
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

func TestH1LeavesBodiesOfUnknownLengthToItsFallback(t *testing.T) {
	fb := &recordingTransport{}
	tr := &H1{Fallback: fb}
	for _, n := range []int64{-1, 0} {
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", io.NopCloser(strings.NewReader("streamed")))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = n
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("length %d: %v", n, err)
		}
		resp.Body.Close()
	}
	if fb.asked.Load() != 2 {
		t.Fatalf("the fallback was asked %d times, want 2", fb.asked.Load())
	}
}

func TestH1DropsAConnectionWithBytesPastTheAnswer(t *testing.T) {
	var conns atomic.Int32
	// The answer declares 2 bytes and 7 follow: what is left over must never be read as the
	// next request's answer.
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA!!")
		}
	})
	tr := &H1{}
	defer tr.CloseIdleConnections()
	for i := range 2 {
		resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", []byte("{}")))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != "ok" || resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %q %v, want 200 ok", i, resp.StatusCode, got, err)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections for 2 requests, want 2 (the first one dropped)", n)
	}
}

// BenchmarkH1RoundTrip sends a 1 KB POST and reads a short answer through H1 and through the
// tuned net/http Transport it replaced, against the same loopback server (whose work, in the
// same process, is counted in both), in one run:
//
//	go test -run XXX -bench H1RoundTrip -benchmem -count 4 ./internal/proxy/
func BenchmarkH1RoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	}))
	defer srv.Close()
	body := bytes.Repeat([]byte("x"), 1000)
	for _, c := range []struct {
		name string
		tr   http.RoundTripper
	}{{"H1", NewH1(NewTransport())}, {"net-http", NewTransport()}} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for b.Loop() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", nil)
				setBody(req, &Request{Body: body})
				resp, err := c.tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			c.tr.(interface{ CloseIdleConnections() }).CloseIdleConnections()
		})
	}
}

func TestH1HearsAnAnswerThatComesBeforeTheBody(t *testing.T) {
	// The worker reads the header, answers 401 at once and never reads the 32 MB body (an
	// authentication filter): the answer must reach the caller, not wait on the body's write.
	// (32 MB is more than the sockets' buffers take, so the write stalls.)
	done := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 5\r\n\r\nnokey")
		<-done
	})
	defer close(done)
	tr := &H1{}
	defer tr.CloseIdleConnections()
	type result struct {
		code int
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", bytes.Repeat([]byte("x"), 32<<20)))
		if err != nil {
			got <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b), err}
	}()
	select {
	case r := <-got:
		if r.err != nil || r.code != http.StatusUnauthorized || r.body != "nokey" {
			t.Fatalf("%d %q %v, want the worker's 401", r.code, r.body, r.err)
		}
	case <-time.After(waitFor):
		t.Fatal("an early answer waited on a body the worker does not read")
	}
	if n := idleCount(tr); n != 0 {
		t.Fatalf("%d connections pooled with a body still being written, want 0", n)
	}
}

func TestH1BodyShorterThanDeclared(t *testing.T) {
	// A body that ends before its declared length must not leave the worker and the transport
	// waiting on each other, whichever way it is written.
	for _, size := range []int64{10_000, 1 << 20} {
		closed := make(chan struct{})
		url := rawServer(t, func(c net.Conn) {
			defer close(closed)
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err == nil {
				io.Copy(io.Discard, req.Body) // until the transport gives up
			}
		})
		req, err := http.NewRequest(http.MethodPost, url+"/", io.NopCloser(bytes.NewReader(make([]byte, size/10))))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size
		errc := make(chan error, 1)
		go func() {
			resp, err := (&H1{}).RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		select {
		case err := <-errc:
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("size %d: err = %v, want errBadRequest", size, err)
			}
		case <-time.After(waitFor):
			t.Fatalf("size %d: a short body hung the request", size)
		}
		select {
		case <-closed:
		case <-time.After(waitFor):
			t.Fatalf("size %d: the worker's connection stayed open", size)
		}
	}
}

// wrapped is a RoundTripper around another that says so, as the tracing transport does.
type wrapped struct{ http.RoundTripper }

func (w wrapped) Unwrap() http.RoundTripper { return w.RoundTripper }

func TestForwarderSeesH1ThroughAWrapper(t *testing.T) {
	for _, c := range []struct {
		tr     http.RoundTripper
		direct bool
	}{
		{nil, true},
		{&H1{}, true},
		{wrapped{&H1{}}, true},
		{wrapped{wrapped{&H1{}}}, true},
		{NewTransport(), false},
		{wrapped{NewTransport()}, false},
	} {
		if f := New(Config{Transport: c.tr}); f.direct != c.direct {
			t.Errorf("%T: direct %v, want %v", c.tr, f.direct, c.direct)
		}
	}
}
