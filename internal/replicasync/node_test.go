package replicasync

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestNode(t testing.TB, c *clock, cfg Config) *Node {
	t.Helper()
	cfg.Now = c.now
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// deliver flushes from and applies every batch to each of to, returning the batches.
func deliver(t testing.TB, from *Node, to ...*Node) [][]byte {
	t.Helper()
	var out [][]byte
	if err := from.Flush(func(b []byte) error {
		out = append(out, append([]byte(nil), b...))
		for _, n := range to {
			if err := n.Apply(b); err != nil {
				t.Fatalf("apply: %v", err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDecisionsReachPeersAsSentAndPlaced(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{Key: []byte("k")}), newTestNode(t, c, Config{Key: []byte("k")})
	report := c.t
	c.t = c.t.Add(time.Millisecond)
	prompt := strings.Repeat("system prompt ", 100) // 1400 bytes: 5 whole chunks and a tail
	a.Decided("m", "w1", prompt, "req-1", 300)
	a.Decided("m", "w1", prompt+" and more", "req-2", 20)
	a.Decided("m", "w2", "other", "req-3", 5)
	deliver(t, a, b)

	if tok, req := b.SentSince("w1", report); tok != 320 || req != 2 {
		t.Errorf("SentSince(w1) = %v tokens %v requests, want 320, 2", tok, req)
	}
	if tok, _ := b.SentSince("w1", c.t); tok != 0 {
		t.Errorf("SentSince(w1, after receipt) = %v, want 0", tok)
	}
	a.Finished("m", "w1", "req-1")
	deliver(t, a, b)
	if _, req := b.SentSince("w1", report); req != 1 {
		t.Errorf("after a finish, requests = %v, want 1", req)
	}

	out := make([]int, 3)
	b.Placed("m", prompt, []string{"w1", "w2", "w3"}, out)
	if out[0] != len(prompt) || out[1] != 0 || out[2] != 0 {
		t.Errorf("Placed(same text) = %v, want [%d 0 0]", out, len(prompt))
	}
	b.Placed("m", prompt[:1100]+"different tail", []string{"w1"}, out[:1])
	if out[0] != 4*ChunkBytes {
		t.Errorf("Placed(shared 1100 bytes) = %d, want %d (4 sampled chunks)", out[0], 4*ChunkBytes)
	}
	b.Placed("other-model", prompt, []string{"w1"}, out[:1])
	if out[0] != 0 {
		t.Errorf("another model's view placed %d", out[0])
	}
	// A differently keyed cluster computes other hashes: nothing matches.
	x := newTestNode(t, c, Config{Key: []byte("other")})
	x.Placed("m", prompt, []string{"w1"}, out[:1])
	if out[0] != 0 {
		t.Errorf("unkeyed view placed %d", out[0])
	}
	if a.Peers() != 0 || b.Peers() != 1 {
		t.Errorf("peers a=%d b=%d, want 0 and 1", a.Peers(), b.Peers())
	}
}

func TestAffinityIsShared(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{}), newTestNode(t, c, Config{AffinityTTL: time.Minute})
	a.Bound(NSResponse, "resp_123", "m", "w7")
	a.Bound(NSSession, "user-9", "m", "w3")
	deliver(t, a, b)
	if w, ok := b.Affinity(NSResponse, "resp_123"); !ok || w != "w7" {
		t.Errorf("Affinity(response) = %q %v, want w7", w, ok)
	}
	if w, ok := b.Affinity(NSSession, "user-9"); !ok || w != "w3" {
		t.Errorf("Affinity(session) = %q %v, want w3", w, ok)
	}
	if _, ok := b.Affinity(NSSession, "resp_123"); ok {
		t.Error("a response id answered as a session key")
	}
	c.t = c.t.Add(2 * time.Minute)
	if _, ok := b.Affinity(NSResponse, "resp_123"); ok {
		t.Error("a binding past its TTL answered")
	}
}

func TestBatchesApplyOnceInOrder(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{}), newTestNode(t, c, Config{})
	a.Decided("m", "w1", "", "", 10)
	batches := deliver(t, a, b)
	if err := b.Apply(batches[0]); !errors.Is(err, ErrDuplicate) {
		t.Errorf("redelivered batch: %v, want ErrDuplicate", err)
	}
	if err := a.Apply(batches[0]); !errors.Is(err, ErrSelf) {
		t.Errorf("own batch: %v, want ErrSelf", err)
	}
	if tok, _ := b.SentSince("w1", time.Unix(0, 0)); tok != 10 {
		t.Errorf("tokens after a duplicate = %v, want 10", tok)
	}
	// A lost batch is a gap, counted; the next one applies.
	a.Decided("m", "w1", "", "", 1)
	_ = a.Flush(func([]byte) error { return nil })
	a.Decided("m", "w1", "", "", 2)
	deliver(t, a, b)
	if g := b.Stats().Gaps.Load(); g != 1 {
		t.Errorf("gaps = %d, want 1", g)
	}
}

func TestGarbageBansThePeer(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{BanFor: time.Minute}), newTestNode(t, c, Config{BanFor: time.Minute})
	a.Decided("m", "w1", "", "", 10)
	var good []byte
	_ = a.Flush(func(m []byte) error { good = append([]byte(nil), m...); return nil })
	bad := append(append([]byte(nil), good[:headerBytes]...), byte(KindDecision), 200) // a name too long
	if err := b.Apply(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("garbage: %v, want ErrMalformed", err)
	}
	if err := b.Apply(good); !errors.Is(err, ErrBanned) {
		t.Errorf("after garbage: %v, want ErrBanned", err)
	}
	if tok, _ := b.SentSince("w1", time.Unix(0, 0)); tok != 0 {
		t.Errorf("a banned peer's records applied: %v tokens", tok)
	}
	if b.Stats().Malformed.Load() != 1 || b.Stats().Banned.Load() != 1 {
		t.Errorf("malformed=%d banned=%d, want 1 and 1", b.Stats().Malformed.Load(), b.Stats().Banned.Load())
	}
	if err := b.Apply([]byte{2, 0, 0}); err == nil {
		t.Error("an unknown version applied")
	}
}

func TestFloodingPeerIsBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	b := newTestNode(t, c, Config{PeerRecords: 100, MaxWorkers: 8, MaxPlacements: 64})
	hostile := newTestNode(t, c, Config{})
	for i := range 1000 {
		hostile.Decided("m", "w"+strings.Repeat("x", i%50), strings.Repeat("y", 2000+i), "", MaxUncached)
	}
	applied := 0
	_ = hostile.Flush(func(m []byte) error {
		if b.Apply(m) == nil {
			applied++
		}
		return nil
	})
	if b.Stats().OverRate.Load() == 0 {
		t.Error("a flood over the record rate was not bounded")
	}
	b.mu.Lock()
	workers, placements := len(b.logs), len(b.models["m"].fifo)
	b.mu.Unlock()
	if workers > 8 || placements > 64 {
		t.Errorf("tables grew past their bounds: %d workers, %d placements", workers, placements)
	}
	// A flood of senders is bounded too.
	for range 100 {
		h := newTestNode(t, c, Config{})
		_ = h.Flush(func(m []byte) error { _ = b.Apply(m); return nil })
	}
	if p := b.Peers(); p > DefaultConfig().MaxPeers {
		t.Errorf("%d peers tracked, bound %d", p, DefaultConfig().MaxPeers)
	}
	if b.Stats().OverPeers.Load() == 0 {
		t.Error("senders past MaxPeers were not counted")
	}
}

func TestDecisionRecordIsSmall(t *testing.T) {
	// A long-context prompt through a gateway's 8 KiB routing prefix, a typical model name and
	// worker id.
	text := strings.Repeat("0123456789abcdef", 512)
	var hb, sb [64]uint64
	hashes, _ := NewChainer(nil).Sampled(hb[:0], sb[:0], text)
	rec := AppendDecision(nil, "meta-llama/Llama-3.1-8B-Instruct", "w-5f2c9a1e", 1, 6000, hashes)
	if len(rec) > 200 {
		t.Errorf("a decision record is %d bytes, target 200", len(rec))
	}
	t.Logf("decision record: %d bytes, %d hashes", len(rec), len(hashes))
}

func TestApplyAllocatesNothingOnTheSteadyPath(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{MaxPlacements: 1024}), newTestNode(t, c, Config{MaxPlacements: 1024, PeerRecords: 1e12, PeerBytes: 1e15})
	text := strings.Repeat("z", 3000)
	var msgs [][]byte
	for i := range 64 {
		a.Decided("m", "w1", text[:2000+i*10], "", 100)
		a.Finished("m", "w1", "")
		_ = a.Flush(func(m []byte) error { msgs = append(msgs, append([]byte(nil), m...)); return nil })
	}
	for _, m := range msgs[:32] {
		_ = b.Apply(m)
	}
	i := 32
	allocs := testing.AllocsPerRun(31, func() {
		c.t = c.t.Add(time.Millisecond)
		if err := b.Apply(msgs[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs > 0 {
		t.Errorf("Apply allocates %.1f times per batch", allocs)
	}
}
