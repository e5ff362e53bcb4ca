//go:build linux || darwin || freebsd || netbsd || openbsd

package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"syscall"
	"testing"
)

func TestH1AliveSeesAClose(t *testing.T) {
	hangUp := make(chan struct{})
	closed := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		if _, _, err := readRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		<-hangUp
		c.Close()
		close(closed)
	})
	tr := &H1{}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(h1Post(t, context.Background(), url+"/", []byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	tr.mu.Lock()
	var c *h1Conn
	for _, cs := range tr.idle {
		c = cs[0]
	}
	tr.mu.Unlock()
	if c == nil {
		t.Fatal("the connection was not pooled")
	}
	if !c.alive() {
		t.Fatal("an open idle connection was reported closed")
	}
	close(hangUp)
	<-closed
	// Wait, through the poller, until the close reaches the socket (it makes it readable).
	c.raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN
	})
	if c.alive() {
		t.Fatal("a connection the worker closed is still reported alive")
	}
}
