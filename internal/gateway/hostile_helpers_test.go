package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
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
