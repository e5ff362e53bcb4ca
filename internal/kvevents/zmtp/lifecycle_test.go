package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// within waits for cond, polling, failing the test after 10 s. Goroutine counts and budget
// use have no channel to signal them, so they are polled.
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recvT waits for one value from ch, failing after 10 s.
func recvT[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10 s", what)
	}
	var zero T
	return zero
}

// Every peer's goroutines and its MaxPeers slot end with it: 250 publishers that handshake and
// leave, and 250 connections that close before handshaking, leave the socket as they found it,
// and a publisher still gets through afterwards.
func TestPeersAreReleased(t *testing.T) {
	joins, leaves := make(chan Peer, 1), make(chan Peer, 1)
	sub := NewSocket(SUB, Options{MaxPeers: 8, Subscribe: []string{"kv"},
		OnJoin: func(p Peer) { joins <- p }, OnLeave: func(p Peer) { leaves <- p }})
	closeT(t, sub)
	addr := mustListen(t, sub)
	base := runtime.NumGoroutine()
	seen := map[uint64]bool{}
	for i := range 250 {
		c, _ := rawPeer(t, addr, "PUB")
		j := recvT(t, joins, "join")
		if seen[j.ID] || !j.Addr.IsLoopback() || j.Endpoint != "" {
			t.Fatalf("cycle %d: peer %+v (ids must not repeat, the address is loopback)", i, j)
		}
		seen[j.ID] = true
		c.Close()
		if l := recvT(t, leaves, "leave"); l.ID != j.ID {
			t.Fatalf("cycle %d: left %d, joined %d", i, l.ID, j.ID)
		}
		raw, err := net.Dial("tcp", addr[len("tcp://"):])
		if err != nil {
			t.Fatal(err)
		}
		raw.Close()
	}
	within(t, "connections still handshaking", func() bool { return sub.Handshaking() == 0 })
	if n := sub.Peers(); n != 0 {
		t.Fatalf("%d peers counted after every one left", n)
	}
	within(t, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= base })
	pub := NewSocket(PUB, Options{})
	closeT(t, pub)
	pub.Dial(addr)
	recvT(t, joins, "join of a real publisher")
	pubsub(t, pub, sub)
}

// A dialing socket backs off while its peer is unreachable: the pause doubles from RedialMin to
// RedialMax, spread by the injected randomness.
func TestDialBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused at once
	waits, fire := make(chan time.Duration, 1), make(chan time.Time)
	sub := NewSocket(SUB, Options{RedialMin: 100 * time.Millisecond, RedialMax: time.Second,
		After: func(d time.Duration) <-chan time.Time { waits <- d; return fire },
		Rand:  func() float64 { return 0.75 }}) // +10 %
	closeT(t, sub)
	sub.Dial(endpoint)
	want := []time.Duration{110, 220, 440, 880, 1100, 1100, 1100}
	for i, w := range want {
		if d := recvT(t, waits, "redial pause"); d != w*time.Millisecond {
			t.Fatalf("pause %d: %v, want %v", i, d, w*time.Millisecond)
		}
		fire <- time.Time{}
	}
}

// A publisher that goes away and comes back on the same address is dialed again, and what it
// sends then arrives; the new connection is a new peer.
func TestDialSurvivesPublisherRestart(t *testing.T) {
	pub := NewSocket(PUB, Options{})
	addr := mustListen(t, pub)
	joins := make(chan Peer, 4)
	sub := NewSocket(SUB, Options{Subscribe: []string{"kv"}, RedialMin: time.Millisecond, RedialMax: 10 * time.Millisecond,
		OnJoin: func(p Peer) { joins <- p }})
	closeT(t, sub)
	sub.Dial(addr)
	first := recvT(t, joins, "first join")
	if first.Endpoint != addr {
		t.Fatalf("dialed peer's endpoint %q, want %q", first.Endpoint, addr)
	}
	pubsub(t, pub, sub)
	pub.Close()
	pub2 := NewSocket(PUB, Options{})
	closeT(t, pub2)
	if _, err := pub2.Listen(addr); err != nil {
		t.Fatal(err)
	}
	if again := recvT(t, joins, "join after the restart"); again.ID == first.ID {
		t.Fatal("the new connection kept the old peer id")
	}
	pubsub(t, pub2, sub)
}

// A frame's bytes are charged as they arrive: a peer announcing 8 MiB and sending ten bytes
// holds the first chunk only, and nothing once it is gone.
func TestAnnouncedFrameIsNotAllocated(t *testing.T) {
	b := NewBudget(64 << 20)
	sub := NewSocket(SUB, Options{MaxFrame: 16 << 20, Budget: b, Subscribe: []string{""}})
	closeT(t, sub)
	addr := mustListen(t, sub)
	c, _ := rawPeer(t, addr, "PUB")
	c.Write(append(append([]byte{flagLong}, binary.BigEndian.AppendUint64(nil, 8<<20)...), "0123456789"...))
	within(t, "the frame's first chunk charged", func() bool { return b.Used() > 0 })
	if u := b.Used(); u != firstChunk {
		t.Fatalf("%d bytes charged for a frame announcing 8 MiB with 10 bytes sent, want %d", u, firstChunk)
	}
	c.Close()
	within(t, "the budget released", func() bool { return b.Used() == 0 })
}

// A peer that starts a message and stalls is cut at MessageTimeout and its bytes released.
func TestStalledMessageIsCut(t *testing.T) {
	b := NewBudget(64 << 20)
	sub := NewSocket(SUB, Options{Budget: b, MessageTimeout: 100 * time.Millisecond})
	closeT(t, sub)
	addr := mustListen(t, sub)
	c, r := rawPeer(t, addr, "PUB")
	c.Write(append([]byte{flagMore, 2}, 'k'))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("the stalled peer was not disconnected: %v", err)
	}
	within(t, "the budget released", func() bool { return b.Used() == 0 })
}

// Messages waiting in the receive queue hold their bytes: with nobody receiving, the socket
// holds no more than its budget and drops what does not fit (as a high-water mark does, the
// receiver sees gaps), and every message it kept arrives intact and in order.
func TestReceiveQueueIsBoundedInBytes(t *testing.T) {
	b := NewBudget(1 << 20)
	sub := NewSocket(SUB, Options{MaxFrame: 256 << 10, Budget: b, Subscribe: []string{"kv"}})
	closeT(t, sub)
	pub := NewSocket(PUB, Options{})
	closeT(t, pub)
	sub.Dial(mustListen(t, pub))
	ctx := ctxT(t)
	if err := pub.WaitPeers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 200<<10)
	for i := range 12 {
		payload[0] = byte(i)
		pub.Send(ctx, [][]byte{[]byte("kv"), append([]byte(nil), payload...)})
	}
	within(t, "messages dropped", func() bool { return sub.Dropped() > 0 })
	if u := b.Used(); u > b.Limit() {
		t.Fatalf("%d bytes held, budget %d", u, b.Limit())
	}
	got, last := 0, -1
	for got+int(sub.Dropped()) < 12 {
		m, err := sub.RecvMessage(ctx)
		if err != nil {
			t.Fatalf("after %d received, %d dropped: %v", got, sub.Dropped(), err)
		}
		if len(m.Frames) != 2 || int(m.Frames[1][0]) <= last || len(m.Frames[1]) != 200<<10 {
			t.Fatalf("message %d after %d: %d frames", m.Frames[1][0], last, len(m.Frames))
		}
		last = int(m.Frames[1][0])
		got++
		m.Release()
	}
	if got < 4 {
		t.Fatalf("only %d of 12 kept with room for 5", got)
	}
	within(t, "the budget released", func() bool { return b.Used() == 0 })
}

// At most MaxHandshakes connections may be handshaking at once; the rest are closed before a
// byte is sent, and a silent connection is closed at HandshakeTimeout.
func TestHandshakesAreCapped(t *testing.T) {
	sub := NewSocket(SUB, Options{MaxHandshakes: 4, HandshakeTimeout: 2 * time.Second})
	closeT(t, sub)
	addr := mustListen(t, sub)[len("tcp://"):]
	var conns []net.Conn
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	var admitted, refused int
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			refused++
			continue
		}
		admitted++
		if _, err := io.Copy(io.Discard, bufio.NewReader(c)); err != nil {
			t.Fatalf("a silent connection was not closed at the handshake timeout: %v", err)
		}
	}
	if admitted != 4 || refused != 6 {
		t.Fatalf("admitted %d, refused %d; want 4 and 6", admitted, refused)
	}
	within(t, "handshakes counted", func() bool { return sub.Handshaking() == 0 })
}

// Allow vets the source address before anything is read or sent.
func TestAllowRefusesSources(t *testing.T) {
	asked := make(chan netip.Addr, 1)
	sub := NewSocket(SUB, Options{Allow: func(a netip.Addr) bool { asked <- a; return false }})
	closeT(t, sub)
	addr := mustListen(t, sub)[len("tcp://"):]
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 64)); err == nil || n > 0 {
		t.Fatalf("a refused source got %d bytes", n)
	}
	if a := recvT(t, asked, "question"); !a.IsLoopback() {
		t.Fatalf("asked about %v", a)
	}
}

// Whatever bytes arrive, the budget ends up charged with exactly what the message read holds
// (nothing on error or drop), and never more than its limit.
func FuzzReadMessageBudget(f *testing.F) {
	f.Add([]byte{flagMore, 3, 'a', 'b', 'c', flagLong, 0, 0, 0, 0, 0, 1, 0, 0, 'x'}, uint16(300))
	f.Add([]byte{0, 200, 1, 2, 3}, uint16(10))
	f.Fuzz(func(t *testing.T, b []byte, limit uint16) {
		bud := NewBudget(int64(limit) + 1)
		mt := &meter{ctx: context.Background(), budget: bud}
		lim := limits{maxFrame: 1 << 17, maxFrames: 4, maxTotal: 1 << 18}
		m, held, err := readMessage(bufio.NewReader(bytes.NewReader(b)), lim, mt)
		if err != nil {
			if bud.Used() != 0 {
				t.Fatalf("%d bytes left charged after %v", bud.Used(), err)
			}
			return
		}
		sum := 0
		for _, fr := range m.frames {
			sum += cap(fr)
		}
		if int64(held) != bud.Used() || held != sum {
			t.Fatalf("held %d, charged %d, frames' capacity %d", held, bud.Used(), sum)
		}
	})
}
