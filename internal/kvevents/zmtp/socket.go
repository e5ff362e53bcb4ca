package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
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
	// MaxPeers is the most peers a bound socket serves at once; more are disconnected. Default
	// 1024.
	MaxPeers int
	// HandshakeTimeout bounds the greeting and READY exchange. Default 5 s.
	HandshakeTimeout time.Duration
	// Subscribe lists the topic prefixes a SUB socket asks its publishers for; nil means
	// everything.
	Subscribe []string
	// Identity is the identity a DEALER announces; nil lets the ROUTER choose one.
	Identity []byte
	// Redial is the pause between dial attempts while a dialed peer is unreachable. Default
	// 500 ms.
	Redial time.Duration
	// OnJoin, when set, is called after each peer completes its handshake.
	OnJoin func()
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
	if o.MaxPeers <= 0 {
		o.MaxPeers = 1024
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.Redial <= 0 {
		o.Redial = 500 * time.Millisecond
	}
	return o
}

// ErrClosed is returned by operations on a closed socket.
var ErrClosed = errors.New("zmtp: socket closed")

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

	mu        sync.Mutex
	peers     map[*peer]struct{}
	listeners []net.Listener
	nextID    uint32
	joined    chan struct{} // closed and replaced whenever a peer completes its handshake

	in      chan [][]byte
	dropped atomic.Uint64
}

// peer is one connected, handshaken peer.
type peer struct {
	conn net.Conn
	out  chan outMsg
	id   []byte   // ROUTER: the routing identity
	subs [][]byte // PUB: the prefixes the peer subscribed to (guarded by Socket.mu)
	done chan struct{}
}

// outMsg is a queued message, or a command when cmd is set.
type outMsg struct {
	frames [][]byte
	cmd    []byte
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
		in:     make(chan [][]byte, o.QueueLen),
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

// Dial connects to "tcp://host:port" in the background and keeps reconnecting, every Redial,
// whenever the connection fails or ends, until Close.
func (s *Socket) Dial(endpoint string) error {
	addr, err := tcpAddr(endpoint)
	if err != nil {
		return err
	}
	s.wg.Go(func() {
		d := net.Dialer{Timeout: s.opts.HandshakeTimeout}
		for s.ctx.Err() == nil {
			if c, err := d.DialContext(s.ctx, "tcp", addr); err == nil {
				s.serve(c)
			}
			select {
			case <-s.ctx.Done():
			case <-time.After(s.opts.Redial):
			}
		}
	})
	return nil
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

func (s *Socket) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		full := len(s.peers) >= s.opts.MaxPeers
		s.mu.Unlock()
		if full {
			c.Close()
			continue
		}
		s.wg.Go(func() { s.serve(c) })
	}
}

// Close disconnects every peer, stops listening and waits for every goroutine to exit. Messages
// still queued are dropped.
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
	return nil
}

// serve handshakes with c, then reads from it until it fails; a writer goroutine drains the
// peer's queue meanwhile.
func (s *Socket) serve(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	props, err := s.handshake(c, r, w)
	if err != nil {
		return
	}
	p := &peer{conn: c, out: make(chan outMsg, s.opts.QueueLen), done: make(chan struct{})}
	s.mu.Lock()
	if s.typ == ROUTER {
		p.id = props["Identity"]
		if len(p.id) == 0 {
			s.nextID++
			p.id = binary.BigEndian.AppendUint32([]byte{0}, s.nextID)
		}
	}
	s.peers[p] = struct{}{}
	close(s.joined)
	s.joined = make(chan struct{})
	s.mu.Unlock()
	if s.opts.OnJoin != nil {
		s.opts.OnJoin()
	}
	defer func() {
		s.mu.Lock()
		delete(s.peers, p)
		s.mu.Unlock()
		close(p.done)
	}()
	if s.typ == SUB {
		subs := s.opts.Subscribe
		if subs == nil {
			subs = []string{""}
		}
		for _, t := range subs {
			select {
			case p.out <- outMsg{frames: [][]byte{append([]byte{1}, t...)}}:
			default:
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.write(p, w) })
	defer wg.Wait()
	defer c.Close()
	for {
		m, err := readMessage(r, s.lim)
		if err != nil {
			return
		}
		if m.command {
			s.handleCommand(p, w, m.frames[0])
			continue
		}
		switch s.typ {
		case PUB:
			s.subscription(p, m.frames)
		case ROUTER:
			s.deliver(append([][]byte{p.id}, m.frames...))
		default:
			s.deliver(m.frames)
		}
	}
}

// handshake exchanges greetings and READY commands and checks the peer's socket type.
func (s *Socket) handshake(c net.Conn, r *bufio.Reader, w *bufio.Writer) (map[string][]byte, error) {
	c.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	w.Write(greeting())
	var id []byte
	if s.typ == DEALER {
		id = s.opts.Identity
	}
	writeFrame(w, command("READY", readyData(string(s.typ), id)), flagCommand)
	if err := w.Flush(); err != nil {
		return nil, err
	}
	g := make([]byte, greetingLen)
	if _, err := readFull(r, g); err != nil {
		return nil, err
	}
	if err := checkGreeting(g); err != nil {
		return nil, err
	}
	m, err := readMessage(r, limits{maxFrame: 4096, maxFrames: 1, maxTotal: 4096})
	if err != nil {
		return nil, err
	}
	if !m.command {
		return nil, fmt.Errorf("%w: expected READY", ErrProtocol)
	}
	name, data, err := parseCommand(m.frames[0])
	if err != nil || name != "READY" {
		return nil, fmt.Errorf("%w: expected READY", ErrProtocol)
	}
	raw, err := parseReady(data)
	if err != nil {
		return nil, err
	}
	props := map[string][]byte{}
	for k, v := range raw {
		switch {
		case strings.EqualFold(k, "Socket-Type"):
			props["Socket-Type"] = v
		case strings.EqualFold(k, "Identity"):
			if len(v) > 255 || len(v) > 0 && v[0] == 0 {
				return nil, fmt.Errorf("%w: invalid identity", ErrProtocol)
			}
			props["Identity"] = bytes.Clone(v)
		}
	}
	pt := string(props["Socket-Type"])
	ok := false
	for _, t := range compatible[s.typ] {
		ok = ok || t == pt
	}
	if !ok {
		return nil, fmt.Errorf("%w: a %s socket cannot talk to a %q socket", ErrProtocol, s.typ, pt)
	}
	return props, nil
}

func readFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// handleCommand answers PING and records ZMTP 3.1 SUBSCRIBE/CANCEL commands.
func (s *Socket) handleCommand(p *peer, w *bufio.Writer, body []byte) {
	name, data, err := parseCommand(body)
	if err != nil {
		return
	}
	switch name {
	case "SUBSCRIBE", "CANCEL":
		if s.typ == PUB {
			flag := byte(1)
			if name == "CANCEL" {
				flag = 0
			}
			s.subscription(p, [][]byte{append([]byte{flag}, data...)})
		}
	case "PING":
		// PING carries a TTL (2 bytes) and a context echoed in PONG.
		if len(data) >= 2 {
			select {
			case p.out <- outMsg{cmd: command("PONG", data[2:])}:
			default:
			}
		}
	}
}

// maxSubs bounds the subscriptions one peer may hold.
const maxSubs = 64

// subscription applies a subscribe (first byte 1) or unsubscribe (0) message from a SUB peer.
func (s *Socket) subscription(p *peer, frames [][]byte) {
	if len(frames) != 1 || len(frames[0]) == 0 || len(frames[0]) > 1024 {
		return
	}
	topic := frames[0][1:]
	s.mu.Lock()
	defer s.mu.Unlock()
	switch frames[0][0] {
	case 1:
		if len(p.subs) < maxSubs {
			p.subs = append(p.subs, bytes.Clone(topic))
			close(s.joined)
			s.joined = make(chan struct{})
		}
	case 0:
		for i, t := range p.subs {
			if bytes.Equal(t, topic) {
				p.subs = append(p.subs[:i], p.subs[i+1:]...)
				break
			}
		}
	}
}

// deliver queues a received message, dropping it when the queue is full.
func (s *Socket) deliver(frames [][]byte) {
	select {
	case s.in <- frames:
	default:
		s.dropped.Add(1)
	}
}

// write sends the peer's queued messages until the peer or the socket is done.
func (s *Socket) write(p *peer, w *bufio.Writer) {
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-p.done:
			return
		case m := <-p.out:
			var err error
			if m.cmd != nil {
				err = writeFrame(w, m.cmd, flagCommand)
			} else {
				err = writeMessage(w, m.frames)
			}
			if err == nil && len(p.out) == 0 {
				err = w.Flush()
			}
			if err != nil {
				p.conn.Close()
				return
			}
		}
	}
}

// Recv returns the next received message: for a ROUTER its first frame is the sender's
// identity. It fails when ctx is done or the socket is closed.
func (s *Socket) Recv(ctx context.Context) ([][]byte, error) {
	select {
	case m := <-s.in:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, ErrClosed
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
