package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustListen(t *testing.T, s *Socket) string {
	t.Helper()
	addr, err := s.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return "tcp://" + addr
}

func closeT(t *testing.T, s *Socket) { t.Cleanup(func() { s.Close() }) }

// pubsub checks that a message sent by pub reaches sub with its frames intact, and that a topic
// sub did not subscribe to does not.
func pubsub(t *testing.T, pub, sub *Socket) {
	ctx := ctxT(t)
	if err := pub.WaitPeers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 1000) // a long frame
	pub.Send(ctx, [][]byte{[]byte("other@x"), {1}, {2}})
	pub.Send(ctx, [][]byte{[]byte("kv@h:1@m"), {0, 0, 0, 0, 0, 0, 0, 7}, big})
	m, err := sub.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || string(m[0]) != "kv@h:1@m" || m[1][7] != 7 || !bytes.Equal(m[2], big) {
		t.Fatalf("got %q", m)
	}
}

func TestPubBindsSubDials(t *testing.T) {
	pub := NewSocket(PUB, Options{})
	closeT(t, pub)
	sub := NewSocket(SUB, Options{Subscribe: []string{"kv"}})
	closeT(t, sub)
	sub.Dial(mustListen(t, pub))
	pubsub(t, pub, sub)
}

func TestSubBindsPubDials(t *testing.T) {
	sub := NewSocket(SUB, Options{Subscribe: []string{"kv"}})
	closeT(t, sub)
	pub := NewSocket(PUB, Options{})
	closeT(t, pub)
	pub.Dial(mustListen(t, sub))
	pubsub(t, pub, sub)
}

func TestRouterDealer(t *testing.T) {
	ctx := ctxT(t)
	r := NewSocket(ROUTER, Options{})
	closeT(t, r)
	d := NewSocket(DEALER, Options{})
	closeT(t, d)
	d.Dial(mustListen(t, r))
	if err := d.Send(ctx, [][]byte{nil, []byte("req")}); err != nil {
		t.Fatal(err)
	}
	m, err := r.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || len(m[0]) == 0 || len(m[1]) != 0 || string(m[2]) != "req" {
		t.Fatalf("router got %q", m)
	}
	for i := range 3 {
		if err := r.Send(ctx, [][]byte{m[0], nil, {byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		got, err := d.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[1][0] != byte(i) {
			t.Fatalf("dealer got %q", got)
		}
	}
}

// rawPeer handshakes as a SUB-compatible PUB by hand, so a test can then send arbitrary bytes.
func rawPeer(t *testing.T, addr string, typ string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w := bufio.NewWriter(c)
	w.Write(greeting())
	writeFrame(w, command("READY", readyData(typ, nil)), flagCommand)
	w.Flush()
	r := bufio.NewReader(c)
	g := make([]byte, greetingLen)
	if _, err := readFull(r, g); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readMessage(r, limits{4096, 1, 4096}, nil); err != nil {
		t.Fatal(err)
	}
	return c, r
}

func TestHostilePeerIsDisconnectedNotBelieved(t *testing.T) {
	ctx := ctxT(t)
	sub := NewSocket(SUB, Options{MaxFrame: 1 << 10, Subscribe: []string{"kv"}})
	closeT(t, sub)
	addr := mustListen(t, sub)

	cases := map[string][]byte{
		// A long frame announcing 2^62 bytes: must not be allocated.
		"huge frame": append([]byte{flagLong}, binary.BigEndian.AppendUint64(nil, 1<<62)...),
		// Reserved flag bits.
		"bad flags": {0xf0, 0},
		// Too many frames: 100 one-byte frames with MORE.
		"too many frames": bytes.Repeat([]byte{flagMore, 1, 'a'}, 100),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			c, r := rawPeer(t, addr, "PUB")
			// Drain the subscription the SUB sends.
			readMessage(r, limits{4096, 1, 4096}, nil)
			c.Write(payload)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := r.ReadByte(); err == nil {
				t.Fatal("the connection stayed open after hostile input")
			}
		})
	}
	// A well-behaved publisher still gets through afterwards.
	pub := NewSocket(PUB, Options{})
	closeT(t, pub)
	pub.Dial(addr)
	pubsub(t, pub, sub)
	_ = ctx
}

func TestWrongSocketTypeIsRefused(t *testing.T) {
	sub := NewSocket(SUB, Options{})
	closeT(t, sub)
	addr := mustListen(t, sub)
	c, err := net.Dial("tcp", addr[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := bufio.NewWriter(c)
	w.Write(greeting())
	writeFrame(w, command("READY", readyData("SUB", nil)), flagCommand)
	w.Flush()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	g := make([]byte, greetingLen)
	readFull(r, g)
	readMessage(r, limits{4096, 1, 4096}, nil)
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("a SUB talking to a SUB was not disconnected")
	}
	if sub.Peers() != 0 {
		t.Fatalf("peers = %d", sub.Peers())
	}
}

func FuzzReadMessage(f *testing.F) {
	f.Add([]byte{0, 3, 'a', 'b', 'c'})
	f.Add([]byte{flagMore, 1, 'a', flagLong, 0, 0, 0, 0, 0, 0, 0, 1, 'b'})
	f.Add([]byte{flagCommand, 6, 5, 'R', 'E', 'A', 'D', 'Y'})
	f.Fuzz(func(t *testing.T, b []byte) {
		lim := limits{maxFrame: 64, maxFrames: 4, maxTotal: 128}
		m, _, err := readMessage(bufio.NewReader(bytes.NewReader(b)), lim, nil)
		if err != nil {
			return
		}
		if len(m.frames) > 4 {
			t.Fatalf("%d frames", len(m.frames))
		}
		for _, fr := range m.frames {
			if len(fr) > 64 {
				t.Fatalf("frame of %d bytes", len(fr))
			}
		}
		if m.command {
			if _, data, err := parseCommand(m.frames[0]); err == nil {
				parseReady(data)
			}
		}
	})
}
