package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"time"
)

// readBufSize is a connection's read buffer: large frames bypass it (readBody reads them
// straight into their own growing buffer), so it only needs to hold frame headers and small
// messages.
const readBufSize = 4 << 10

// peer is one connected, handshaken peer.
type peer struct {
	info Peer
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

// sendsData reports whether a socket of this type sends messages in bulk (PUB, ROUTER) rather
// than a few subscriptions and requests (SUB, DEALER); only those get a full send queue and a
// large write buffer, so that a connection to a receiving socket stays small.
func (s *Socket) sendsData() bool { return s.typ == PUB || s.typ == ROUTER }

// serve handshakes with c, then reads from it until it fails while a writer goroutine drains
// the peer's queue; it returns once both are done and the peer is forgotten, reporting whether
// the handshake completed. endpoint is the endpoint dialed, "" for an accepted connection
// (which accept counted as handshaking).
func (s *Socket) serve(c net.Conn, endpoint string) (joined bool) {
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	r := bufio.NewReaderSize(c, readBufSize)
	props, err := s.handshake(c, r)
	p := &peer{conn: c, done: make(chan struct{}),
		info: Peer{ID: s.conns.Add(1), Addr: remoteAddr(c), Endpoint: endpoint}}
	s.mu.Lock()
	if endpoint == "" {
		s.handshakes--
	}
	if err != nil || s.ctx.Err() != nil {
		s.mu.Unlock()
		return false
	}
	queue := maxSubs + 8
	if s.sendsData() {
		queue = s.opts.QueueLen
	}
	p.out = make(chan outMsg, queue)
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
		s.opts.OnJoin(p.info)
	}
	if s.typ == SUB {
		subs := s.opts.Subscribe
		if subs == nil {
			subs = []string{""}
		}
		for _, t := range subs[:min(len(subs), maxSubs)] {
			p.out <- outMsg{frames: [][]byte{append([]byte{1}, t...)}}
		}
	}
	wbuf := readBufSize
	if s.sendsData() {
		wbuf = 64 << 10
	}
	w := bufio.NewWriterSize(c, wbuf)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.write(p, w)
	}()
	s.readLoop(p, r)
	// The reader is done: stop the writer (closing the connection ends a write in progress),
	// wait for it, then forget the peer.
	c.Close()
	s.mu.Lock()
	delete(s.peers, p)
	s.mu.Unlock()
	close(p.done)
	<-writerDone
	if s.opts.OnLeave != nil {
		s.opts.OnLeave(p.info)
	}
	return true
}

// readLoop reads p's messages until the connection fails. Each message's bytes are charged to
// the budget as they arrive, and a message must arrive whole within MessageTimeout of its first
// byte; an idle connection may stay idle.
func (s *Socket) readLoop(p *peer, r *bufio.Reader) {
	b := s.opts.Budget
	mt := &meter{ctx: s.ctx, budget: b}
	for {
		if _, err := r.Peek(1); err != nil {
			return
		}
		p.conn.SetReadDeadline(time.Now().Add(s.opts.MessageTimeout))
		m, held, err := readMessage(r, s.lim, mt)
		if err == errDropped {
			s.dropped.Add(1)
			p.conn.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			return
		}
		mt.done()
		p.conn.SetReadDeadline(time.Time{})
		msg := Message{Frames: m.frames, Peer: p.info, budget: b, held: int64(held)}
		switch {
		case m.command:
			s.handleCommand(p, m.frames[0])
			msg.Release()
		case s.typ == PUB:
			s.subscription(p, m.frames)
			msg.Release()
		case s.typ == ROUTER:
			msg.Frames = append([][]byte{p.id}, m.frames...)
			s.deliver(msg)
		default:
			s.deliver(msg)
		}
	}
}

// handshake exchanges greetings and READY commands and checks the peer's socket type. It
// allocates only what the greeting and a READY of at most 4 KiB need.
func (s *Socket) handshake(c net.Conn, r *bufio.Reader) (map[string][]byte, error) {
	c.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	var id []byte
	if s.typ == DEALER {
		id = s.opts.Identity
	}
	var hello bytes.Buffer
	w := bufio.NewWriterSize(&hello, 512)
	w.Write(greeting())
	writeFrame(w, command("READY", readyData(string(s.typ), id)), flagCommand)
	w.Flush()
	if _, err := c.Write(hello.Bytes()); err != nil {
		return nil, err
	}
	g := make([]byte, greetingLen)
	if _, err := readFull(r, g); err != nil {
		return nil, err
	}
	if err := checkGreeting(g); err != nil {
		return nil, err
	}
	m, _, err := readMessage(r, limits{maxFrame: 4096, maxFrames: 1, maxTotal: 4096}, nil)
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
func (s *Socket) handleCommand(p *peer, body []byte) {
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
			case p.out <- outMsg{cmd: command("PONG", bytes.Clone(data[2:]))}:
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

// deliver queues a received message, dropping it (and releasing its bytes) when the queue is
// full.
func (s *Socket) deliver(m Message) {
	select {
	case s.in <- m:
	default:
		m.Release()
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
