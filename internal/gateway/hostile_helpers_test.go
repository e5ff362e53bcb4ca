package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawConn dials addr (host:port) and returns the connection; the test closes it at its end.
func rawConn(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// rawRequest writes a raw HTTP/1.1 request to c.
func rawRequest(t *testing.T, c net.Conn, method, path, body string, hdr ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(method + " " + path + " HTTP/1.1\r\nHost: kvgate\r\n")
	for i := 0; i+1 < len(hdr); i += 2 {
		b.WriteString(hdr[i] + ": " + hdr[i+1] + "\r\n")
	}
	if body != "" {
		b.WriteString("Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n")
	}
	b.WriteString("\r\n" + body)
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
}

// readRawResponse reads one response from c within d.
func readRawResponse(t *testing.T, c net.Conn, d time.Duration) (*http.Response, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	return http.ReadResponse(bufio.NewReader(c), nil)
}

func hostPort(url string) string { return strings.TrimPrefix(url, "http://") }

// rawWorker listens on a loopback port and runs serve on each connection it accepts (then closes
// it); it returns the worker's base URL. The test's cleanup closes the listener and every open
// connection and waits for each serve to return.
func rawWorker(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
	return "http://" + ln.Addr().String()
}
