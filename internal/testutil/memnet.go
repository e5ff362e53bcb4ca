package testutil

// MemNet is an in-memory network for HTTP tests that run inside a testing/synctest bubble. A
// goroutine blocked reading a loopback socket is not durably blocked, so a bubble whose servers
// talk over loopback never lets its fake clock advance; one blocked on a net.Pipe is (the pipe
// waits on channels made in the bubble, and its deadlines are the bubble's timers). Servers
// listen on addresses of the form 127.0.0.1:PORT that exist only in the MemNet, so URLs, Host
// headers and RemoteAddr read as they do over loopback.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
)

// MemNet is a set of in-memory listeners that its Dial reaches by address. Make it inside the
// bubble that uses it (its channels belong to the bubble that makes them). The zero value is
// not usable; use NewMemNet.
type MemNet struct {
	mu        sync.Mutex
	port      int
	listeners map[string]*memListener
}

// NewMemNet returns an empty in-memory network.
func NewMemNet() *MemNet {
	return &MemNet{port: 20000, listeners: map[string]*memListener{}}
}

// errRefused is what a dial to an address nobody listens on gives, as a closed port does.
var errRefused = errors.New("memnet: connection refused")

func (n *MemNet) nextAddr() *net.TCPAddr {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.port++
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: n.port}
}

// Listen returns a listener on a new address of n.
func (n *MemNet) Listen() net.Listener {
	l := &memListener{n: n, addr: n.nextAddr(), conns: make(chan net.Conn), closed: make(chan struct{})}
	n.mu.Lock()
	n.listeners[l.addr.String()] = l
	n.mu.Unlock()
	return l
}

// DialContext connects to the listener at addr (host:port), with the signature of
// net.Dialer.DialContext. It returns once the listener accepted the connection, ctx ended, or
// the listener closed; an address nobody listens on is refused at once.
func (n *MemNet) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errRefused}
	}
	client, server := net.Pipe()
	local := n.nextAddr()
	select {
	case l.conns <- &memConn{Conn: server, local: l.addr, remote: local}:
		return &memConn{Conn: client, local: local, remote: l.addr}, nil
	case <-l.closed:
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errRefused}
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

// Transport returns an HTTP transport that dials n.
func (n *MemNet) Transport() *http.Transport {
	return &http.Transport{DialContext: n.DialContext, DisableCompression: true}
}

// Client returns an HTTP client over a Transport of n.
func (n *MemNet) Client() *http.Client {
	return &http.Client{Transport: n.Transport()}
}

// NewServer starts an httptest.Server for h on a new address of n. Its URL is the address;
// reach it with n's Client or Transport (the server's own Client dials the real network).
func (n *MemNet) NewServer(h http.Handler) *httptest.Server {
	s := &httptest.Server{Listener: n.Listen(), Config: &http.Server{Handler: h}}
	s.Start()
	return s
}

// memListener is one address of a MemNet.
type memListener struct {
	n      *MemNet
	addr   *net.TCPAddr
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close frees the address: later dials to it are refused.
func (l *memListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.n.mu.Lock()
		delete(l.n.listeners, l.addr.String())
		l.n.mu.Unlock()
	})
	return nil
}

func (l *memListener) Addr() net.Addr { return l.addr }

// memConn is one end of a pipe, with TCP addresses in place of the pipe's.
type memConn struct {
	net.Conn
	local, remote *net.TCPAddr
}

func (c *memConn) LocalAddr() net.Addr  { return c.local }
func (c *memConn) RemoteAddr() net.Addr { return c.remote }

// InBubble runs f in a testing/synctest bubble with a new MemNet: f's servers, clients and
// timers all run on the bubble's clock, which moves only when every goroutine in it waits.
func InBubble(t *testing.T, f func(t *testing.T, mn *MemNet)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) { f(t, NewMemNet()) })
}
