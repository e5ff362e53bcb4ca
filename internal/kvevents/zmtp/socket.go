package zmtp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Type is a socket type.
type Type string

// The socket types this package implements.
const (
	PUB    Type = "PUB"
	SUB    Type = "SUB"
	ROUTER Type = "ROUTER"
	DEALER Type = "DEALER"
)

// compatible lists the peer types each socket type talks to (ZMTP 3.0 §"Socket types").
var compatible = map[Type][]string{
	PUB:    {"SUB", "XSUB"},
	SUB:    {"PUB", "XPUB"},
	ROUTER: {"DEALER", "REQ", "ROUTER"},
	DEALER: {"ROUTER", "REP", "DEALER"},
}

// Options bound a socket. Zero fields take their defaults.
type Options struct {
	// MaxFrame is the largest frame accepted, in bytes. Default 16 MiB.
	MaxFrame int
	// MaxFrames is the most frames in one message. Default 8.
	MaxFrames int
	// QueueLen is the high-water mark: messages queued per peer for sending and in total for
	// receiving; past it, PUB and SUB drop messages (the receiver sees a sequence gap). Default
	// 4096.
	QueueLen int
	// Budget bounds, in bytes, the frames being received and the messages waiting in the
	// receive queue, together; several sockets may share one. nil gives the socket its own of
	// 4 × MaxFrame.
	Budget *Budget
	// MaxPeers is the most peers a bound socket serves at once; more are disconnected. Default
	// 1024.
	MaxPeers int
	// MaxHandshakes is the most connections a bound socket lets handshake at once (each holds a
	// few KiB until it has spoken); more are closed at once. Default 64.
	MaxHandshakes int
	// HandshakeTimeout bounds the greeting and READY exchange. Default 5 s.
	HandshakeTimeout time.Duration
	// MessageTimeout bounds the time from a message's first byte to its last: a peer that
	// starts a frame and stalls is disconnected and what it held is released. Default 30 s.
	MessageTimeout time.Duration
	// Allow, when set, is asked about each accepted connection's source address before
	// anything is read from it; false closes the connection.
	Allow func(netip.Addr) bool
	// Subscribe lists the topic prefixes a SUB socket asks its publishers for; nil means
	// everything.
	Subscribe []string
	// Identity is the identity a DEALER announces; nil lets the ROUTER choose one.
	Identity []byte
	// RedialMin and RedialMax bound the pause between dial attempts: it starts at RedialMin,
	// doubles after each attempt that did not reach a handshake, is capped at RedialMax, and is
	// spread ±20 % at random so that many gateways do not redial an engine in step. Defaults
	// 100 ms and 10 s.
	RedialMin, RedialMax time.Duration
	// After and Rand are the clock and the randomness of redialing (tests inject them); nil
	// means time.After and math/rand/v2's Float64.
	After func(time.Duration) <-chan time.Time
	Rand  func() float64
	// OnJoin and OnLeave, when set, are called after a peer completes its handshake and after
	// it is gone (its goroutines ended, nothing of it left), from the peer's own goroutine.
	OnJoin, OnLeave func(Peer)
}

func (o Options) withDefaults() Options {
	if o.MaxFrame <= 0 {
		o.MaxFrame = 16 << 20
	}
	if o.MaxFrames <= 0 {
		o.MaxFrames = 8
	}
	if o.QueueLen <= 0 {
		o.QueueLen = 4096
	}
	if o.Budget == nil {
		o.Budget = NewBudget(4 * int64(o.MaxFrame))
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = 1024
	}
	if o.MaxHandshakes <= 0 {
		o.MaxHandshakes = 64
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.MessageTimeout <= 0 {
		o.MessageTimeout = 30 * time.Second
	}
	if o.RedialMin <= 0 {
		o.RedialMin = 100 * time.Millisecond
	}
	if o.RedialMax < o.RedialMin {
		o.RedialMax = max(10*time.Second, o.RedialMin)
	}
	if o.After == nil {
		o.After = time.After
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return o
}

// ErrClosed is returned by operations on a closed socket.
var ErrClosed = errors.New("zmtp: socket closed")

// Peer identifies one connection of a socket.
type Peer struct {
	// ID is unique among the socket's connections, from 1: a peer that reconnects has a new one.
	ID uint64
	// Addr is the remote address (an IPv4 address in IPv6 form unmapped).
	Addr netip.Addr
	// Endpoint is the endpoint dialed, "" for an accepted connection.
	Endpoint string
}

// Message is one received message: its frames, the peer it came from, and its share of the
// socket's Budget, held until Release.
type Message struct {
	Frames [][]byte
	Peer   Peer

	budget *Budget
	held   int64
}

// Release returns the message's bytes to the budget; call it once done with Frames. Calling it
// again does nothing.
func (m *Message) Release() {
	if m.budget != nil {
		m.budget.release(m.held)
		m.budget, m.held = nil, 0
	}
}

// Socket is one ZeroMQ socket of a given type, bound to any number of addresses and dialing any
// number of peers. Safe for concurrent use. Create it with NewSocket; Close stops every
// goroutine it started.
type Socket struct {
	typ  Type
	opts Options
	lim  limits

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	peers      map[*peer]struct{}
	listeners  []net.Listener
	nextID     uint32
	joined     chan struct{} // closed and replaced whenever a peer completes its handshake
	handshakes int           // accepted connections still handshaking

	in      chan Message
	conns   atomic.Uint64 // connection ids handed out
	dropped atomic.Uint64
}

// NewSocket returns a socket of type typ with no connections; Close releases it.
func NewSocket(typ Type, opts Options) *Socket {
	o := opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Socket{
		typ: typ, opts: o,
		lim: limits{maxFrame: o.MaxFrame, maxFrames: o.MaxFrames, maxTotal: o.MaxFrame * 2},
		ctx: ctx, cancel: cancel,
		peers:  map[*peer]struct{}{},
		joined: make(chan struct{}),
		in:     make(chan Message, o.QueueLen),
	}
}

// Dropped returns how many messages were dropped at a full queue, either way.
func (s *Socket) Dropped() uint64 { return s.dropped.Load() }

// Listen binds "tcp://host:port" (a "*" host means every interface) and serves every peer that
// connects, up to MaxPeers at once. It returns the bound address as host:port.
func (s *Socket) Listen(endpoint string) (string, error) {
	addr, err := tcpAddr(endpoint)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("zmtp: listen %s: %w", endpoint, err)
	}
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		ln.Close()
		return "", ErrClosed
	}
	s.listeners = append(s.listeners, ln)
	s.mu.Unlock()
	s.wg.Go(func() { s.accept(ln) })
	return ln.Addr().String(), nil
}

// Dial connects to "tcp://host:port" in the background and keeps reconnecting whenever the
// connection fails or ends, until Close: the pause between attempts backs off from RedialMin
// to RedialMax (with jitter) while attempts fail, and starts over after a handshake.
func (s *Socket) Dial(endpoint string) error {
	addr, err := tcpAddr(endpoint)
	if err != nil {
		return err
	}
	s.wg.Go(func() {
		d := net.Dialer{Timeout: s.opts.HandshakeTimeout}
		pause := s.opts.RedialMin
		for s.ctx.Err() == nil {
			if c, err := d.DialContext(s.ctx, "tcp", addr); err == nil {
				if s.serve(c, endpoint) {
					pause = s.opts.RedialMin
				}
			}
			select {
			case <-s.ctx.Done():
			case <-s.opts.After(jitter(pause, s.opts.Rand())):
			}
			pause = min(2*pause, s.opts.RedialMax)
		}
	})
	return nil
}

// jitter spreads d by ±20 %, r in [0, 1).
func jitter(d time.Duration, r float64) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*r))
}

// tcpAddr turns a ZeroMQ endpoint into a Go dial/listen address.
func tcpAddr(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("zmtp: endpoint %q: only tcp:// is supported", endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

// remoteAddr returns c's remote IP address, unmapped; the zero Addr when it has none.
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func (s *Socket) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
		if s.opts.Allow != nil && !s.opts.Allow(remoteAddr(c)) {
			c.Close()
			continue
		}
		s.mu.Lock()
		full := len(s.peers)+s.handshakes >= s.opts.MaxPeers || s.handshakes >= s.opts.MaxHandshakes
		if !full {
			s.handshakes++
		}
		s.mu.Unlock()
		if full {
			c.Close()
			continue
		}
		s.wg.Go(func() { s.serve(c, "") })
	}
}

// Close disconnects every peer, stops listening and waits for every goroutine to exit. Messages
// still queued are dropped and their bytes returned to the budget.
func (s *Socket) Close() error {
	s.cancel()
	s.mu.Lock()
	for _, ln := range s.listeners {
		ln.Close()
	}
	for p := range s.peers {
		p.conn.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	for {
		select {
		case m := <-s.in:
			m.Release()
		default:
			return nil
		}
	}
}

// Recv returns the frames of the next received message, releasing its bytes at once: for a
// ROUTER the first frame is the sender's identity. It fails when ctx is done or the socket is
// closed.
func (s *Socket) Recv(ctx context.Context) ([][]byte, error) {
	m, err := s.RecvMessage(ctx)
	m.Release()
	return m.Frames, err
}

// RecvMessage returns the next received message with the peer it came from; the caller
// releases it when done with its frames.
func (s *Socket) RecvMessage(ctx context.Context) (Message, error) {
	select {
	case m := <-s.in:
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-s.ctx.Done():
		return Message{}, ErrClosed
	}
}

// Send sends one message. PUB: to every peer subscribed to a prefix of the first frame, dropping
// it for a peer whose queue is full; it never blocks. ROUTER: to the peer whose identity is the
// first frame (which is not sent), waiting for room; a message for an unknown peer is dropped.
// DEALER: to the first connected peer, waiting for one to connect and for room. SUB sends
// nothing.
func (s *Socket) Send(ctx context.Context, frames [][]byte) error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	if len(frames) == 0 {
		return errors.New("zmtp: empty message")
	}
	switch s.typ {
	case PUB:
		s.mu.Lock()
		defer s.mu.Unlock()
		for p := range s.peers {
			if matches(p.subs, frames[0]) {
				select {
				case p.out <- outMsg{frames: frames}:
				default:
					s.dropped.Add(1)
				}
			}
		}
		return nil
	case ROUTER:
		s.mu.Lock()
		var to *peer
		for p := range s.peers {
			if bytes.Equal(p.id, frames[0]) {
				to = p
				break
			}
		}
		s.mu.Unlock()
		if to == nil {
			return nil
		}
		return s.enqueue(ctx, to, frames[1:])
	case DEALER:
		for {
			s.mu.Lock()
			var to *peer
			for p := range s.peers {
				to = p
				break
			}
			joined := s.joined
			s.mu.Unlock()
			if to != nil {
				return s.enqueue(ctx, to, frames)
			}
			select {
			case <-joined:
			case <-ctx.Done():
				return ctx.Err()
			case <-s.ctx.Done():
				return ErrClosed
			}
		}
	}
	return fmt.Errorf("zmtp: a %s socket does not send", s.typ)
}

func (s *Socket) enqueue(ctx context.Context, p *peer, frames [][]byte) error {
	select {
	case p.out <- outMsg{frames: frames}:
		return nil
	case <-p.done:
		return errors.New("zmtp: peer disconnected")
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return ErrClosed
	}
}

// matches reports whether topic starts with one of the subscribed prefixes.
func matches(subs [][]byte, topic []byte) bool {
	for _, t := range subs {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

// Peers returns the number of handshaken peers.
func (s *Socket) Peers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.peers)
}

// Handshaking returns the number of accepted connections that have not completed their
// handshake yet.
func (s *Socket) Handshaking() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handshakes
}

// WaitPeers blocks until at least n peers have completed their handshake (for a PUB: and sent
// a subscription, so that what is sent next reaches them), or ctx is done.
func (s *Socket) WaitPeers(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		k := 0
		for p := range s.peers {
			if s.typ != PUB || len(p.subs) > 0 {
				k++
			}
		}
		joined := s.joined
		s.mu.Unlock()
		if k >= n {
			return nil
		}
		select {
		case <-joined:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return ErrClosed
		}
	}
}
