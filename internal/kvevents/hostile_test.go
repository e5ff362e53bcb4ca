package kvevents

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The hostile-publisher suite: one gateway-side Service with its defaults, one honest engine
// publishing throughout, and every attack the issue names, each measured by the live heap
// after a collection while the attack holds what it can. The honest engine's events must still
// be applied afterwards.

// hostileBudget is how much the gateway's heap may grow above its baseline under any attack.
const hostileBudget = 64 << 20

// rawFrame encodes one ZMTP frame.
func rawFrame(body []byte, more, cmd bool) []byte {
	var flags byte
	if more {
		flags |= 1
	}
	if cmd {
		flags |= 4
	}
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | 2}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// rawHello is a PUB's greeting and READY, written by hand.
func rawHello() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, 11)
	ready = append(ready, "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, 3)
	ready = append(ready, "PUB"...)
	return append(g, rawFrame(ready, false, true)...)
}

// rawPublisher connects to addr and handshakes as a PUB by hand; what the socket sends back is
// left unread (a few bytes the kernel buffers).
func rawPublisher(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(rawHello()); err != nil {
		t.Fatal(err)
	}
	return c
}

// acceptedPublisher is rawPublisher that returns only once the socket has taken the connection
// (its greeting arrived), dialing again when the socket refused it: the cap on connections
// handshaking at once is shared with any that an earlier case left still draining, so a case
// that needs every one of its connections served must not race that cap.
func acceptedPublisher(t *testing.T, svc *Service, addr string) net.Conn {
	t.Helper()
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err = c.Write(rawHello()); err == nil {
			_, err = io.ReadFull(c, make([]byte, 64))
		}
		c.SetDeadline(time.Time{})
		if err == nil {
			return c
		}
		c.Close()
		within(t, "the handshakes drained", func() bool { return svc.bind.Handshaking() == 0 })
	}
	t.Fatal("the socket refused 20 connections in a row")
	return nil
}

// rawMessage encodes [topic, seq, payload].
func rawMessage(topic string, seq uint64, payload []byte) []byte {
	m := rawFrame([]byte(topic), true, false)
	m = append(m, rawFrame(seqBytes(seq), true, false)...)
	return append(m, rawFrame(payload, false, false)...)
}

// stallable makes a rig whose message handling can be held, so that an attack's messages pile
// up in the socket queue and the byte budget as far as the gateway lets them.
type stallable struct {
	mu    sync.Mutex
	held  chan struct{} // non-nil while stalled: handling waits on it
	enter chan struct{} // one send per message that reached the stall
}

func (s *stallable) after() {
	s.mu.Lock()
	h := s.held
	s.mu.Unlock()
	if h != nil {
		select {
		case s.enter <- struct{}{}:
		default:
		}
		<-h
	}
}

func (s *stallable) stall() {
	s.mu.Lock()
	s.held = make(chan struct{})
	s.mu.Unlock()
}

// resume lets handling go on; it may be called again (a deferred resume after an explicit one).
func (s *stallable) resume() {
	s.mu.Lock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
	s.mu.Unlock()
}

func TestHostilePublishers(t *testing.T) {
	if testing.Short() {
		t.Skip("sends hundreds of MiB over loopback")
	}
	st := &stallable{enter: make(chan struct{}, 1)}
	handled := make(chan struct{}, 1<<16)
	r := &rig{handled: handled, clock: &fakeClock{t: time.Unix(1e9, 0)}}
	svc, err := New(Config{Bind: "tcp://127.0.0.1:0", Now: r.clock.Now, AfterMessage: func() {
		st.after()
		select {
		case handled <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	r.svc = svc
	addr := svc.BindAddr

	honest := newWorker(t, "http://127.0.0.1:9801", nil)
	victim := newWorker(t, "http://10.9.9.9:8000", nil) // elsewhere: never contacted
	svc.Track(honest)
	svc.Track(victim)
	topic := Topic("127.0.0.1:9801", "m")
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + addr}, Topic: topic})
	waitSubs(t, pub)
	next := uint32(0) // the honest engine's next prompt
	publish := func(n int) {
		before := svc.Stats().Batches
		for range n {
			pub.Publish(batch(stored([]uint64{uint64(next) + 1}, 0, false, 16, next*1000)))
			next++
		}
		within(t, "the honest batches applied", func() bool { return svc.Stats().Batches >= before+uint64(n) })
	}
	publish(10)
	goroutines := runtime.NumGoroutine()
	base := heapInUse()
	// check measures the heap above the baseline, less what the test itself holds (own bytes).
	check := func(what string, own int64) {
		t.Helper()
		grew := heapInUse() - base - own
		t.Logf("%s: heap %+.1f MiB over the baseline", what, float64(grew)/(1<<20))
		if grew > hostileBudget {
			t.Fatalf("%s: the heap grew %d MiB above the baseline (bound %d MiB)", what, grew>>20, hostileBudget>>20)
		}
	}

	t.Run("churn", func(t *testing.T) {
		for range 300 {
			c := rawPublisher(t, addr)
			c.Close()
		}
		within(t, "connections released", func() bool { return svc.bind.Peers() == 1 && svc.bind.Handshaking() == 0 })
		settled(t, goroutines+1) // this subtest's own
		check("after 300 connect/close cycles", 0)
	})

	t.Run("announced large frames", func(t *testing.T) {
		var conns []net.Conn
		for range 64 {
			c := acceptedPublisher(t, svc, addr)
			defer c.Close()
			c.Write(append(binary.BigEndian.AppendUint64([]byte{2}, 8<<20), bytes.Repeat([]byte{'x'}, 100)...))
			conns = append(conns, c)
		}
		within(t, "the frames begun", func() bool { return svc.budget.Used() >= 64*(64<<10) })
		check("64 publishers announcing 8 MiB frames", 0)
		for _, c := range conns {
			c.Close()
		}
		within(t, "the budget released", func() bool { return svc.budget.Used() == 0 })
	})

	t.Run("real large frames", func(t *testing.T) {
		st.stall()
		defer st.resume()                               // a failure here must not leave the later cases' handler held
		payload := bytes.Repeat([]byte{0xc0}, 8<<20-64) // shared: the test's own memory stays small
		publish1 := func(c net.Conn, i int) {
			head := rawFrame([]byte(topic), true, false)
			head = append(head, rawFrame(seqBytes(1<<40+uint64(i)), true, false)...)
			head = binary.BigEndian.AppendUint64(append(head, 2), uint64(len(payload)))
			bufs := net.Buffers{head, payload}
			bufs.WriteTo(c)
		}
		var wg sync.WaitGroup
		for i := range 16 {
			c := rawPublisher(t, addr)
			defer c.Close()
			wg.Go(func() {
				c.SetWriteDeadline(time.Now().Add(20 * time.Second))
				publish1(c, i)
				publish1(c, i+100)
			})
		}
		recvT := func() {
			select {
			case <-st.enter:
			case <-time.After(10 * time.Second):
				t.Fatal("no message reached the handler")
			}
		}
		recvT()
		// The attack has done what it can once the budget is full or every message was written
		// (queued or dropped: a reader that cannot charge a message drops it). Which comes first
		// depends on the machine's speed; the bounds below must hold either way.
		written := make(chan struct{})
		go func() { wg.Wait(); close(written) }()
		settle := time.NewTimer(10 * time.Second)
		defer settle.Stop()
		for full := false; !full; {
			select {
			case <-written:
				full = true
			case <-settle.C:
				full = true
			case <-time.After(5 * time.Millisecond):
				full = svc.budget.Used() > svc.cfg.MaxBuffered-int64(svc.cfg.MaxFrame)
			}
		}
		if used := svc.budget.Used(); used > svc.cfg.MaxBuffered {
			t.Fatalf("%d bytes charged to a %d-byte budget", used, svc.cfg.MaxBuffered)
		}
		check("16 publishers sending 8 MiB messages, the handler held", int64(len(payload)))
		st.resume()
		wg.Wait()
	})

	t.Run("amplification", func(t *testing.T) {
		c := rawPublisher(t, addr)
		defer c.Close()
		refused := func() uint64 { s := svc.Stats(); return s.Malformed + s.Dropped }
		before := refused()
		// Decoding is transient: sample the live heap (after a collection) while it runs.
		stop, peak := make(chan struct{}), make(chan int64)
		go func() {
			var top int64
			for {
				select {
				case <-stop:
					peak <- top
					return
				default:
					top = max(top, heapInUse()-base)
				}
			}
		}()
		var own int64 // the test's payloads, garbage before the last measure
		func() {
			hashes := rawMessage(Topic("127.0.0.1:9801", "amp"), 0, amplifyingHashes())
			events := rawMessage(Topic("127.0.0.1:9801", "amp"), 0, amplifyingEvents())
			own = int64(len(hashes) + len(events))
			for range 5 {
				c.Write(hashes)
				c.Write(events)
			}
		}()
		within(t, "the amplifying batches refused", func() bool { return refused() >= before+10 })
		close(stop)
		top := <-peak
		top -= own
		t.Logf("10 amplifying batches: the live heap peaked %+.1f MiB over the baseline while they were decoded", float64(top)/(1<<20))
		if top > hostileBudget {
			t.Fatalf("decoding amplifying batches: the live heap peaked %d MiB above the baseline", top>>20)
		}
		check("10 amplifying batches", 0)
	})

	t.Run("poisoning", func(t *testing.T) {
		c := rawPublisher(t, addr)
		defer c.Close()
		var fake, odd bytes.Buffer
		Encode(&fake, batch(stored([]uint64{999}, 0, false, 16, 424242)), Legacy)
		Encode(&odd, &Batch{TS: 1, HasRank: true, Rank: 33, Events: []Event{stored([]uint64{5}, 0, false, 7, 1)}}, Legacy)
		before := svc.Stats()
		c.Write(rawMessage(topic, 1<<64-2, fake.Bytes()))                      // a far jump on the honest stream
		c.Write(rawMessage(Topic("10.9.9.9:8000", "m"), 0, fake.Bytes()))      // another host's worker
		c.Write(rawMessage(Topic("127.0.0.1:9801", "m"), 0, odd.Bytes()))      // an odd block size, invented rank
		c.Write(rawMessage(topic, 3, []byte{0x93, 0xc0, 0xc0, 0xc0, 0xc1, 0})) // garbage
		within(t, "the poison handled", func() bool {
			s := svc.Stats()
			return s.Rejected > before.Rejected && s.Malformed > before.Malformed && s.Resyncs > before.Resyncs
		})
		if _, ok := r.match("m", prompt(16, 424242, 1), victim.ID); ok {
			t.Fatal("a fake BlockStored made another host's worker answer")
		}
	})

	t.Run("silent connections", func(t *testing.T) {
		var conns []net.Conn
		for range 1000 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns = append(conns, c)
		}
		if n := svc.bind.Handshaking(); n > 64 {
			t.Fatalf("%d connections handshaking at once", n)
		}
		check("1000 silent connections", 0)
		for _, c := range conns {
			c.Close()
		}
	})

	// The honest engine is still heard, and once the poisoned number's resync window is over
	// its new blocks are matched.
	publish(20)
	r.clock.Add(svc.cfg.Resync)
	for p := next - 20; p < next; p++ {
		if out, ok := r.match("m", prompt(16, p*1000, 1), honest.ID); !ok || out[0] != 16 {
			t.Fatalf("the honest engine's block %d after the attacks: %v %v", p, out, ok)
		}
	}
	settled(t, goroutines)
}

// settled waits for the goroutines to fall back to n, and shows them when they do not.
func settled(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// amplifyingHashes is a batch of one BlockRemoved with 8 M one-byte hashes: 8 MiB on the wire,
// 64 MiB decoded if nothing bounded it.
func amplifyingHashes() []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.EncodeArrayLen(2)
	e.EncodeFloat64(1)
	e.EncodeArrayLen(1)
	e.EncodeArrayLen(2)
	e.EncodeString("BlockRemoved")
	n := 8<<20 - 64
	e.EncodeArrayLen(n)
	buf.Write(make([]byte, n)) // n fixint zeros
	return buf.Bytes()
}

// amplifyingEvents is a batch of 400,000 AllBlocksCleared events: 7 MiB on the wire, about
// 40 MiB decoded if nothing bounded it.
func amplifyingEvents() []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.EncodeArrayLen(2)
	e.EncodeFloat64(1)
	e.EncodeArrayLen(400_000)
	for range 400_000 {
		e.EncodeArrayLen(1)
		e.EncodeString("AllBlocksCleared")
	}
	return buf.Bytes()
}
