package kvevents

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// rig is a Service whose handled messages can be awaited.
type rig struct {
	svc     *Service
	handled chan struct{}
	clock   *fakeClock
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	r := &rig{handled: make(chan struct{}, 1024), clock: &fakeClock{t: time.Unix(1e9, 0)}}
	cfg.Now = r.clock.Now
	cfg.AfterMessage = func() { r.handled <- struct{}{} }
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	r.svc = svc
	return r
}

// wait waits for n handled messages.
func (r *rig) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-r.handled:
		case <-time.After(10 * time.Second):
			t.Fatal("no message handled within 10 s")
		}
	}
}

func (r *rig) match(model string, toks []uint32, ids ...string) ([]int, bool) {
	out := make([]int, len(ids))
	ok := r.svc.idx.Match(model, toks, ids, out, r.clock.Now())
	return out, ok
}

func newWorker(t *testing.T, rawURL string, labels map[string]string) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Spec{URL: rawURL, Labels: labels}, worker.BreakerConfig{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func newPub(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func waitSubs(t *testing.T, p *Publisher) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// chain returns the BlockStored event of blocks of bs tokens each, the first token of block i
// being base+i, parent the engine hash before them.
func stored(hashes []uint64, parent uint64, hasParent bool, bs int, base uint32) Event {
	e := Event{Kind: BlockStored, Hashes: hashes, Parent: parent, HasParent: hasParent, BlockSize: bs}
	for i := range hashes {
		for j := range bs {
			e.Tokens = append(e.Tokens, base+uint32(i*100+j))
		}
	}
	return e
}

func prompt(bs int, base uint32, blocks int) []uint32 {
	var out []uint32
	for i := range blocks {
		for j := range bs {
			out = append(out, base+uint32(i*100+j))
		}
	}
	return out
}

func batch(evs ...Event) *Batch { return &Batch{TS: 1, Events: evs} }

// Engines dial the gateway's SUB socket; topics map to workers by address; stores, removals
// and clears show in matches; a worker that leaves takes its picture with it.
func TestBindModeFollowsStoresRemovalsAndLeaving(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0"})
	w := newWorker(t, "http://127.0.0.1:9001", nil)
	r.svc.Track(w)
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic("127.0.0.1:9001", "m")})
	waitSubs(t, pub)

	p := prompt(4, 1, 3)
	pub.Publish(batch(stored([]uint64{101, 102, 103}, 0, false, 4, 1)))
	r.wait(t, 1)
	if out, ok := r.match("m", p, w.ID); !ok || out[0] != 12 {
		t.Fatalf("after storing 3 blocks: match %v %v, want 12 tokens", out, ok)
	}
	if _, ok := r.match("other-model", p, w.ID); ok {
		t.Fatal("a stream for model m answered for another model")
	}
	pub.Publish(batch(Event{Kind: BlockRemoved, Hashes: []uint64{102}}))
	r.wait(t, 1)
	if out, _ := r.match("m", p, w.ID); out[0] != 4 {
		t.Fatalf("after removing block 2: %d tokens, want 4 (block 3 is unreachable)", out[0])
	}
	pub.Publish(batch(Event{Kind: AllBlocksCleared}))
	r.wait(t, 1)
	if out, _ := r.match("m", p, w.ID); out[0] != 0 {
		t.Fatalf("after a clear: %d tokens", out[0])
	}
	pub.Publish(batch(stored([]uint64{101}, 0, false, 4, 1)))
	r.wait(t, 1)
	r.svc.Forget(w.ID)
	if _, ok := r.match("m", p, w.ID); ok {
		t.Fatal("a worker that left still answers")
	}
	if st := r.svc.Stats(); st.Index.Blocks != 0 || st.Batches != 4 {
		t.Fatalf("stats after leaving: %+v", st)
	}
}

// A gap in the sequence is filled from the publisher's replay socket: nothing is lost.
func TestGapIsReplayed(t *testing.T) {
	r := newRig(t, Config{})
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", ReplayBind: "tcp://127.0.0.1:0", Topic: "kv"})
	w := newWorker(t, "http://127.0.0.1:9002", map[string]string{
		EndpointLabel: "tcp://" + pub.Addr, ReplayLabel: "tcp://" + pub.ReplayAddr})
	if err := r.svc.Track(w); err != nil {
		t.Fatal(err)
	}
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	pub.skip(batch(stored([]uint64{2}, 1, true, 4, 101))) // lost on the way, kept for replay
	pub.Publish(batch(stored([]uint64{3}, 2, true, 4, 201)))
	r.wait(t, 1)
	st := r.svc.Stats()
	if st.Gaps != 1 || st.Replayed != 1 || st.Resyncs != 0 {
		t.Fatalf("stats %+v, want one gap, replayed", st)
	}
	if out, ok := r.match("", prompt(4, 1, 3), w.ID); !ok || out[0] != 12 {
		t.Fatalf("after the replay: %v %v, want all 12 tokens", out, ok)
	}
}

// A gap nobody can replay drops the worker's picture: matches fail (the prefix tree decides)
// until the resync window passes, and what was stored before the gap is forgotten.
func TestGapWithoutReplayResyncs(t *testing.T) {
	r := newRig(t, Config{Resync: 5 * time.Second})
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", Topic: "kv"})
	w := newWorker(t, "http://127.0.0.1:9003", map[string]string{EndpointLabel: "tcp://" + pub.Addr})
	r.svc.Track(w)
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	pub.skip(batch(Event{Kind: BlockRemoved, Hashes: []uint64{1}}))
	pub.Publish(batch(stored([]uint64{7}, 0, false, 4, 700)))
	r.wait(t, 1)
	if st := r.svc.Stats(); st.Gaps != 1 || st.Resyncs != 1 {
		t.Fatalf("stats %+v, want one gap, resynced", st)
	}
	if _, ok := r.match("", prompt(4, 1, 1), w.ID); ok {
		t.Fatal("a resyncing worker answered a match")
	}
	r.clock.Add(5 * time.Second)
	if out, ok := r.match("", prompt(4, 1, 1), w.ID); !ok || out[0] != 0 {
		t.Fatalf("after the window: %v %v; the block removed in the gap must be gone", out, ok)
	}
	if out, _ := r.match("", prompt(4, 700, 1), w.ID); out[0] != 4 {
		t.Fatalf("the block stored after the gap: %d tokens, want 4", out[0])
	}
}

// A publisher that starts over from sequence 0 restarted with an empty cache.
func TestPublisherRestartClears(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0"})
	w := newWorker(t, "http://127.0.0.1:9004", nil)
	r.svc.Track(w)
	topic := Topic("127.0.0.1:9004", "m")
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: topic})
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	pub.Publish(batch(stored([]uint64{2}, 0, false, 4, 50)))
	r.wait(t, 2)
	pub.Close()
	pub2 := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: topic})
	waitSubs(t, pub2)
	pub2.Publish(batch(stored([]uint64{3}, 0, false, 4, 900)))
	r.wait(t, 1)
	if st := r.svc.Stats(); st.Restarts != 1 {
		t.Fatalf("stats %+v", st)
	}
	if out, _ := r.match("m", prompt(4, 1, 1), w.ID); out[0] != 0 {
		t.Fatal("blocks from before the restart survived it")
	}
}

// A hostile publisher: garbage payloads, unknown topics, a flood of blocks. The gateway counts
// and drops, and the index stays within its bound.
func TestHostilePublisherIsBounded(t *testing.T) {
	r := newRig(t, Config{Bind: "tcp://127.0.0.1:0", MaxBlocks: 100})
	w := newWorker(t, "http://127.0.0.1:9005", nil)
	r.svc.Track(w)
	pub := newPub(t, PublisherConfig{Dial: []string{"tcp://" + r.svc.BindAddr}, Topic: Topic("127.0.0.1:9005", "m")})
	waitSubs(t, pub)
	ctx := t.Context()
	pub.pub.Send(ctx, [][]byte{[]byte(Topic("127.0.0.1:9005", "m")), seqBytes(0), {0xdd, 0xff, 0xff, 0xff, 0xff}})
	pub.pub.Send(ctx, [][]byte{[]byte("kv@10.9.9.9:1@m"), seqBytes(0), {0x90}})
	pub.pub.Send(ctx, [][]byte{[]byte("kv")})
	r.wait(t, 3)
	for i := range 50 {
		hs := make([]uint64, 10)
		for j := range hs {
			hs[j] = uint64(i*10 + j + 1)
		}
		pub.Publish(batch(stored(hs, 0, false, 2, uint32(i*1000))))
	}
	r.wait(t, 50)
	// A flood of invented models: streams past the per-worker bound are dropped.
	for i := range 100 {
		pub.pub.Send(ctx, [][]byte{[]byte(Topic("127.0.0.1:9005", fmt.Sprint("m", i))), seqBytes(0), {0x92, 0x00, 0x90}})
	}
	r.wait(t, 100)
	st := r.svc.Stats()
	if st.Malformed != 2 || st.Unknown != 1+100-(maxSourcesPerWorker-1) || st.Index.Blocks > 100 || st.Index.Evicted == 0 || st.Index.Sources > maxSourcesPerWorker {
		t.Fatalf("stats %+v", st)
	}
}

func TestTopicParsing(t *testing.T) {
	for topic, want := range map[string][2]string{
		"kv":                     {"", ""},
		"kv@10.0.0.1:8000@llama": {"10.0.0.1:8000", "llama"},
		"kv@[::1]:8000@org/m@v2": {"[::1]:8000", "org/m@v2"},
	} {
		a, m, ok := parseTopic(topic)
		if !ok || a != want[0] || m != want[1] {
			t.Errorf("%q: %q %q %v", topic, a, m, ok)
		}
	}
}

// A dialed endpoint that reaches another worker's engine (a port shared by several engines on
// one host): the topic names that engine, and its blocks are credited to it, not to the worker
// whose endpoint was dialed.
func TestTopicWinsOverTheDialedWorker(t *testing.T) {
	r := newRig(t, Config{})
	pub := newPub(t, PublisherConfig{Bind: "tcp://127.0.0.1:0", Topic: Topic("127.0.0.1:9102", "m")})
	a := newWorker(t, "http://127.0.0.1:9101", map[string]string{EndpointLabel: "tcp://" + pub.Addr})
	b := newWorker(t, "http://127.0.0.1:9102", nil)
	r.svc.Track(a)
	r.svc.Track(b)
	waitSubs(t, pub)
	pub.Publish(batch(stored([]uint64{1}, 0, false, 4, 1)))
	r.wait(t, 1)
	out, ok := r.match("m", prompt(4, 1, 1), a.ID, b.ID)
	if !ok || out[0] != 0 || out[1] != 4 {
		t.Fatalf("match %v %v: want the block on the worker the topic names", out, ok)
	}
}

func TestEndpointLabelMustNameTheWorkersHost(t *testing.T) {
	r := newRig(t, Config{})
	w := newWorker(t, "http://127.0.0.1:9201", map[string]string{EndpointLabel: "tcp://10.1.2.3:5557"})
	if err := r.svc.Track(w); err == nil || !strings.Contains(err.Error(), "worker's own") {
		t.Fatalf("a label naming another host was accepted: %v", err)
	}
	bad := newWorker(t, "http://127.0.0.1:9202", map[string]string{ReplayLabel: "udp://127.0.0.1:1"})
	if err := r.svc.Track(bad); err == nil {
		t.Fatal("a non-tcp replay endpoint was accepted")
	}
}
