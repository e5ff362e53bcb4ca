package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// The behaviours of the path to workers (net/http's Transport under the Forwarder) that the
// gateway relies on, each asserted at the connection.

// waitFor bounds every wait of these tests on something another goroutine signals.
const waitFor = 10 * time.Second

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

// waitClosed waits until the server closes a connection, failing with msg if none does.
func (cc *connCounter) waitClosed(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-cc.closed:
	case <-time.After(waitFor):
		t.Fatal(msg)
	}
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
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
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

// workerAt is a ready worker for url.
func workerAt(t *testing.T, url string) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Spec{URL: url, Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	return w
}

// only picks w for every attempt.
func only(w *worker.Worker) Picker { return func([]*worker.Worker) *worker.Worker { return w } }

// TestForwardResendsOnAConnectionTheWorkerClosed: a pooled connection the worker closed after
// its answer costs the next request nothing: it is sent once, on a new connection.
func TestForwardResendsOnAConnectionTheWorkerClosed(t *testing.T) {
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
	w := workerAt(t, url)
	f := New(Config{Retry: RetryConfig{MaxAttempts: 1}})
	for i := range 3 {
		body := strings.Repeat("x", 100*(i+1))
		rec := httptest.NewRecorder()
		res := f.Forward(context.Background(), rec, &Request{Path: "/", Header: http.Header{}, Body: []byte(body)}, only(w))
		if res.Err != nil || rec.Body.String() != body {
			t.Fatalf("request %d: %v, answer %q, want the body back", i, res.Err, rec.Body.String())
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

// TestForwardCancelReachesTheWorker: a client that leaves, before the answer or during it, ends
// the worker's connection, and nothing of it is pooled.
func TestForwardCancelReachesTheWorker(t *testing.T) {
	for _, during := range []bool{false, true} {
		t.Run(fmt.Sprintf("during the answer %v", during), func(t *testing.T) {
			arrived, gone := make(chan struct{}), make(chan struct{})
			srv, cc := newCountedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if during {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: 1\n\n")
					w.(http.Flusher).Flush()
				}
				close(arrived)
				<-r.Context().Done() // the gateway closed the connection
				close(gone)
			}))
			f := New(Config{Retry: RetryConfig{MaxAttempts: 1}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan Result, 1)
			go func() {
				done <- f.Forward(ctx, httptest.NewRecorder(), &Request{Path: "/", Header: http.Header{}, Body: []byte("{}"), Stream: during}, only(workerAt(t, srv.URL)))
			}()
			select {
			case <-arrived:
			case <-time.After(waitFor):
				t.Fatal("the request did not arrive")
			}
			cancel()
			select {
			case res := <-done:
				if res.Status != 499 || !isKind(res.Err, KindCanceled) {
					t.Fatalf("status %d, err %v; want 499, canceled", res.Status, res.Err)
				}
			case <-time.After(waitFor):
				t.Fatal("a cancelled request did not return")
			}
			select {
			case <-gone:
			case <-time.After(waitFor):
				t.Fatal("the worker's connection stayed open after the client left")
			}
			cc.waitClosed(t, "the connection of a cancelled request was not closed")
		})
	}
}

// TestForwardHearsAnAnswerThatComesBeforeTheBody: a worker that reads the header, answers 401 at
// once and never reads the 32 MB body (an authentication filter) is heard: the answer reaches
// the client instead of waiting on the body's write (32 MB is more than the sockets' buffers
// take, so the write stalls).
func TestForwardHearsAnAnswerThatComesBeforeTheBody(t *testing.T) {
	done := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 5\r\n\r\nnokey")
		<-done
	})
	defer close(done)
	f := New(Config{Retry: RetryConfig{MaxAttempts: 1}})
	got := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		f.Forward(context.Background(), rec, &Request{Path: "/", Header: http.Header{}, Body: bytes.Repeat([]byte("x"), 32<<20)}, only(workerAt(t, url)))
		got <- rec
	}()
	select {
	case rec := <-got:
		if rec.Code != http.StatusUnauthorized || rec.Body.String() != "nokey" {
			t.Fatalf("%d %q, want the worker's 401", rec.Code, rec.Body.String())
		}
	case <-time.After(waitFor):
		t.Fatal("an early answer waited on a body the worker does not read")
	}
}

// TestForwardReusesConnections: answers read to their end leave their connection pooled for
// the next request.
func TestForwardReusesConnections(t *testing.T) {
	srv, cc := newCountedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"ok":true}`)
	}))
	tr := NewTransport()
	defer tr.CloseIdleConnections()
	f := New(Config{Transport: tr})
	w := workerAt(t, srv.URL)
	for range 5 {
		if res := f.Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/", Header: http.Header{}, Body: []byte("{}")}, only(w)); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if n := cc.opened.Load(); n != 1 {
		t.Fatalf("5 requests opened %d connections, want 1", n)
	}
	tr.CloseIdleConnections()
	cc.waitClosed(t, "CloseIdleConnections left the pooled connection open")
}
