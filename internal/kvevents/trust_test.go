package kvevents

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// logBuffer collects log output for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *logBuffer) String() string       { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }
func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// within waits until cond holds (testutil.Until: connection ends have no channel).
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Until(t, cond, what)
}

// liveIDs returns the ids of the service's connections up now.
func (r *rig) liveIDs() map[uint64]bool {
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	ids := map[uint64]bool{}
	for k := range r.svc.live {
		ids[k.id] = true
	}
	return ids
}

func firstKey(m map[uint64]bool) uint64 {
	for k := range m {
		return k
	}
	return 0
}

func (r *rig) liveConns() int {
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	return len(r.svc.live)
}

// A bind beyond loopback needs an allow-list; a bind without a host is loopback.
func TestBindBeyondLoopbackNeedsAllowedHosts(t *testing.T) {
	for _, ep := range []string{"tcp://*:0", "tcp://0.0.0.0:0", "tcp://[::]:0"} {
		_, err := New(Config{Bind: ep})
		if err == nil || !strings.Contains(err.Error(), "--kv-events-allowed-hosts") {
			t.Fatalf("%s without --kv-events-allowed-hosts: %v", ep, err)
		}
	}
	if _, err := New(Config{Bind: "tcp://0.0.0.0:0", AllowedHosts: []string{"no such host.invalid"},
		Lookup: func(context.Context, string) ([]netip.Addr, error) { return nil, io.EOF }}); err == nil {
		t.Fatal("an allow-list entry that is no address, CIDR or resolvable name was accepted")
	}
	r := newRig(t, Config{Bind: "tcp://:0"})
	if !strings.HasPrefix(r.svc.BindAddr, "127.0.0.1:") {
		t.Fatalf("a bind without a host listens on %s, want loopback", r.svc.BindAddr)
	}
	s, err := New(Config{Bind: "tcp://0.0.0.0:0", AllowedHosts: []string{"10.0.0.0/8", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// Connections from outside the allow-list are closed before anything is read.
func TestAllowedHostsFilterConnections(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", AllowedHosts: []string{"10.0.0.0/8"}})
	c, err := net.Dial("tcp", r.svc.BindAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 64)); err == nil || n > 0 {
		t.Fatalf("a connection from outside the allow-list got %d bytes", n)
	}
}

// A publisher may speak only for workers on its own host, unless the worker's label allows it:
// a fake BlockStored for a worker elsewhere is refused and changes nothing.
func TestPublisherSpeaksOnlyForItsOwnHost(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", Logger: logs.logger()})
	victim := newWorker(t, "http://10.9.9.9:8000", nil) // never contacted
	allowed := newWorker(t, "http://10.9.9.10:8000", map[string]string{PublisherLabel: "127.0.0.0/8"})
	r.svc.Track(victim)
	r.svc.Track(allowed)
	send := func(hostPort string) {
		pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic(hostPort, "m")})
		waitSubs(t, pub)
		pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
		r.wait(t, 1)
	}
	send("10.9.9.9:8000")
	send("10.9.9.10:8000")
	out, _ := r.match("m", prompt(4, 1, 1), allowed.ID)
	if _, ok := r.match("m", prompt(4, 1, 1), victim.ID); ok || out[0] != 4 {
		t.Fatalf("victim answered %v, allowed worker %v", ok, out)
	}
	if st := r.svc.Stats(); st.Rejected != 1 || st.Batches != 1 {
		t.Fatalf("stats %+v: want one refused, one applied", st)
	}
	if !strings.Contains(logs.String(), "refusing events") {
		t.Fatalf("no log line for the refused publisher:\n%s", logs)
	}
}

// One message numbered 2^64−2 cannot freeze a stream: it is taken as a jump (the picture is
// dropped and distrusted for a while), the real numbers that follow are a jump back, and once
// the window passes the real events are matched again.
func TestSequencePoisonDoesNotFreeze(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", Resync: 5 * time.Second})
	w := newWorker(t, "http://127.0.0.1:9401", nil)
	r.svc.Track(w)
	topic := Topic("127.0.0.1:9401", "m")
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: topic})
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	var buf bytes.Buffer
	Encode(&buf, batch(stored([]uint64{66}, 0, false, 4, 6600)), Legacy)
	pub.pub.Send(t.Context(), [][]byte{[]byte(topic), seqBytes(1<<64 - 2), buf.Bytes()})
	r.wait(t, 1)
	for i := range 3 {
		pub.Publish(batch(stored([]uint64{uint64(10 + i)}, 0, false, 4, uint32(1000*(i+1)))))
	}
	r.wait(t, 3)
	r.clock.Add(5 * time.Second)
	for i := range 3 {
		if out, ok := r.match("m", prompt(4, uint32(1000*(i+1)), 1), w.ID); !ok || out[0] != 4 {
			t.Fatalf("real event %d after the poisoned number: %v %v (frozen)", i, out, ok)
		}
	}
	if out, _ := r.match("m", prompt(4, 6600, 1), w.ID); out[0] != 0 {
		t.Fatal("the poisoned batch's block survived")
	}
	if st := r.svc.Stats(); st.Resyncs != 2 {
		t.Fatalf("stats %+v: want two resyncs (the jump ahead and back)", st)
	}
}

// A bind-mode publisher that restarts and whose first batches never reached the gateway (a
// publisher connecting drops what it sends before the connection is up) comes back on a new
// connection below its old sequence number: that is a restart, not duplicates to ignore.
func TestBindRestartBelowLastSequenceRebuilds(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0"})
	w := newWorker(t, "http://127.0.0.1:9402", nil)
	r.svc.Track(w)
	topic := Topic("127.0.0.1:9402", "m")
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: topic})
	waitSubs(t, pub)
	for i := range 5 {
		pub.Publish(batch(stored([]uint64{uint64(i + 1)}, 0, false, 4, uint32(100*i))))
	}
	r.wait(t, 5)
	pub.Close()
	within(t, "the old connection gone", func() bool { return r.liveConns() == 0 })
	pub2 := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: topic})
	waitSubs(t, pub2)
	pub2.skip(batch())
	pub2.skip(batch())
	pub2.Publish(batch(stored([]uint64{77}, 0, false, 4, 7700)))
	r.wait(t, 1)
	if out, ok := r.match("m", prompt(4, 7700, 1), w.ID); ok || out[0] != 0 {
		// The batches lost in the restart cannot be replayed (no replay socket): resync.
		t.Fatalf("match %v %v during the resync after a restart with lost batches", out, ok)
	}
	r.clock.Add(r.svc.cfg.Resync)
	if out, _ := r.match("m", prompt(4, 0, 1), w.ID); out[0] != 0 {
		t.Fatal("the dead engine's blocks survived its restart")
	}
	if out, _ := r.match("m", prompt(4, 7700, 1), w.ID); out[0] != 4 {
		t.Fatalf("the restarted engine's block: %v", out)
	}
	if st := r.svc.Stats(); st.Restarts != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Dial mode survives an engine restart: the gateway dials again, and the new engine's events
// (from sequence 0) replace the old picture.
func TestDialModeSurvivesEngineRestart(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, Config{Logger: logs.logger()})
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", Topic: "kv"})
	addr := pub.Addr
	w := newWorker(t, "http://127.0.0.1:9403", map[string]string{EndpointLabel: "tcp://" + addr})
	r.svc.Track(w)
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	pub.Close()
	within(t, "the old connection gone", func() bool { return r.liveConns() == 0 })
	pub2 := newPub(t, PublisherConfig{Bind: "tcp://" + addr, Topic: "kv"})
	waitSubs(t, pub2)
	pub2.Publish(batch(stored([]uint64{2}, 0, false, 4, 500)))
	r.wait(t, 1)
	if out, ok := r.match("", prompt(4, 1, 1), w.ID); !ok || out[0] != 0 {
		t.Fatalf("the dead engine's block after the restart: %v %v", out, ok)
	}
	if out, _ := r.match("", prompt(4, 500, 1), w.ID); out[0] != 4 {
		t.Fatalf("the new engine's block: %v", out)
	}
	for _, want := range []string{"connected to the worker's publisher", "publisher disconnected", "publisher restarted"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line %q:\n%s", want, logs)
		}
	}
}

// A publisher that goes away and does not come back: its picture is dropped after Resync (the
// prefix tree routes), not kept to mislead routing.
func TestGonePublisherAgesOut(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", Resync: 5 * time.Second, Logger: logs.logger()})
	w := newWorker(t, "http://127.0.0.1:9404", nil)
	r.svc.Track(w)
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic("127.0.0.1:9404", "m")})
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	pub.Close()
	within(t, "the connection gone", func() bool { return r.liveConns() == 0 })
	r.svc.sweep()
	if out, ok := r.match("m", prompt(4, 1, 1), w.ID); !ok || out[0] != 4 {
		t.Fatalf("within the grace period the picture stays: %v %v", out, ok)
	}
	r.clock.Add(5 * time.Second)
	r.svc.sweep()
	if _, ok := r.match("m", prompt(4, 1, 1), w.ID); ok {
		t.Fatal("a gone publisher's picture still answers")
	}
	if !strings.Contains(logs.String(), "did not come back") {
		t.Fatalf("no log line for the dropped picture:\n%s", logs)
	}
}

// A worker that never publishes gets one warning, naming where its events were expected.
func TestSilentWorkerIsWarnedOnce(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", SilentAfter: time.Minute, Logger: logs.logger()})
	w := newWorker(t, "http://127.0.0.1:9405", nil)
	r.svc.Track(w)
	r.svc.sweep()
	if strings.Contains(logs.String(), "no events") {
		t.Fatal("warned before SilentAfter")
	}
	r.clock.Add(time.Minute)
	r.svc.sweep()
	r.svc.sweep()
	if n := strings.Count(logs.String(), "no events from a worker"); n != 1 || !strings.Contains(logs.String(), r.svc.BindAddr) {
		t.Fatalf("%d warnings, want 1 naming %s:\n%s", n, r.svc.BindAddr, logs)
	}
}

// A worker for which no events were configured (no bind, no port, no label) is not warned
// about: routing its requests on the prefix tree is what was asked for.
func TestUnconfiguredWorkerIsNotWarned(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, Config{SilentAfter: time.Minute, Logger: logs.logger()})
	r.svc.Track(newWorker(t, "http://127.0.0.1:9406", nil))
	r.clock.Add(2 * time.Minute)
	r.svc.sweep()
	if strings.Contains(logs.String(), "no events") {
		t.Fatalf("warned where no events were configured:\n%s", logs)
	}
}

// --kv-events-port with several engines on one host: the workers share one connection to the
// endpoint, the topic's address credits each event to its worker, and a bare topic that cannot
// tell them apart is refused with a warning instead of being credited to the wrong one.
func TestSharedPortEndpoint(t *testing.T) {
	logs := &logBuffer{}
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", Topic: Topic("127.0.0.1:9502", "m")})
	_, port, _ := net.SplitHostPort(pub.Addr)
	p, _ := strconv.Atoi(port)
	r := newRig(t, Config{Port: p, Logger: logs.logger()})
	a := newWorker(t, "http://127.0.0.1:9501", nil)
	b := newWorker(t, "http://127.0.0.1:9502", nil)
	r.svc.Track(a)
	r.svc.Track(b)
	if n := len(r.svc.dialed); n != 1 {
		t.Fatalf("%d sockets for one endpoint", n)
	}
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	if out, _ := r.match("m", prompt(4, 1, 1), b.ID); out[0] != 4 {
		t.Fatalf("the worker the topic names: %v", out)
	}
	if _, ok := r.match("m", prompt(4, 1, 1), a.ID); ok {
		t.Fatal("the other worker on the shared endpoint answered")
	}
	pub.pub.Send(t.Context(), [][]byte{[]byte("kv"), seqBytes(1), {0x92, 0x00, 0x90}})
	r.wait(t, 1)
	if st := r.svc.Stats(); st.Unknown != 1 {
		t.Fatalf("stats %+v: the bare topic must be refused", st)
	}
	for _, want := range []string{"share one publisher endpoint", "names none of the workers sharing"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line %q:\n%s", want, logs)
		}
	}
}

// Garbage and a bad block size on an invented rank are dropped; the stream goes on.
func TestMalformedStreamRecovers(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0"})
	a := newWorker(t, "http://127.0.0.1:9601", nil)
	b := newWorker(t, "http://127.0.0.1:9602", nil)
	r.svc.Track(a)
	r.svc.Track(b)
	pa := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic("127.0.0.1:9601", "m")})
	pb := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic("127.0.0.1:9602", "m")})
	waitSubs(t, pa)
	waitSubs(t, pb)
	pa.Publish(batch(stored([]uint64{1, 2}, 0, false, 4, 1)))
	pb.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 2)
	pb.pub.Send(t.Context(), [][]byte{[]byte(Topic("127.0.0.1:9602", "m")), seqBytes(1), []byte("garbage")})
	odd := Batch{TS: 1, HasRank: true, Rank: 9, Events: []Event{stored([]uint64{5}, 0, false, 7, 1)}}
	pb.Publish(&odd)
	r.wait(t, 2)
	out, ok := r.match("m", prompt(4, 1, 2), a.ID, b.ID)
	if !ok || out[0] != 8 || out[1] != 4 {
		t.Fatalf("after garbage and an odd block size: %v %v, want [8 4]", out, ok)
	}
	if st := r.svc.Stats(); st.Malformed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// cutProxy relays TCP connections to target until cut, which closes every relayed connection
// (a network blip: neither side restarts).
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// A dialed publisher whose connection drops and comes back (the engine did not restart, and is
// idle) keeps its picture past Resync, and its numbering goes on without a restart.
func TestDialReconnectKeepsPicture(t *testing.T) {
	r := newRig(t, Config{Resync: 5 * time.Second})
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", Topic: "kv"})
	proxy := newCutProxy(t, pub.Addr)
	w := newWorker(t, "http://127.0.0.1:9406", map[string]string{EndpointLabel: "tcp://" + proxy.ln.Addr().String()})
	r.svc.Track(w)
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	old := r.liveIDs()
	proxy.cut()
	within(t, "a new connection, and the old one gone on both sides", func() bool {
		ids := r.liveIDs()
		return len(ids) == 1 && !old[firstKey(ids)] && pub.pub.Peers() == 1
	})
	r.clock.Add(10 * time.Second)
	r.svc.sweep()
	if out, ok := r.match("", prompt(4, 1, 1), w.ID); !ok || out[0] != 4 {
		t.Fatalf("after a blip, an idle engine's picture: %v %v", out, ok)
	}
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{2}, 1, true, 4, 101)))
	r.wait(t, 1)
	if out, _ := r.match("", prompt(4, 1, 2), w.ID); out[0] != 8 {
		t.Fatalf("the next event after the blip: %v", out)
	}
	if st := r.svc.Stats(); st.Restarts != 0 || st.Resyncs != 0 {
		t.Fatalf("stats %+v: a blip is no restart", st)
	}
}

// A worker known by host name may be published for from the addresses its name resolves to.
func TestPublisherCheckResolvesWorkerNames(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "engine-a.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		case "engine-b.test":
			return []netip.Addr{netip.MustParseAddr("10.1.1.1")}, nil
		}
		return nil, io.EOF
	}
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", Lookup: lookup})
	a := newWorker(t, "http://engine-a.test:8000", nil)
	b := newWorker(t, "http://engine-b.test:8000", nil)
	r.svc.Track(a)
	r.svc.Track(b)
	within(t, "names resolved", func() bool {
		r.svc.mu.Lock()
		defer r.svc.mu.Unlock()
		return len(r.svc.workers[a.ID].addrs) == 1 && len(r.svc.workers[b.ID].addrs) == 1
	})
	for _, hp := range []string{"engine-a.test:8000", "engine-b.test:8000"} {
		pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic(hp, "m")})
		waitSubs(t, pub)
		pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
		r.wait(t, 1)
	}
	if out, ok := r.match("m", prompt(4, 1, 1), a.ID); !ok || out[0] != 4 {
		t.Fatalf("the worker whose name resolves to the publisher: %v %v", out, ok)
	}
	if _, ok := r.match("m", prompt(4, 1, 1), b.ID); ok {
		t.Fatal("the worker whose name resolves elsewhere took a loopback publisher's events")
	}
	if st := r.svc.Stats(); st.Rejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}
