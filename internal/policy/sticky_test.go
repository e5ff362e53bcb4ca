package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// clock is an injected clock that tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// newTestSticky wraps the named policy in Sticky over loads with an injected clock.
func newTestSticky(t *testing.T, name string, loads Loads, clk *clock, tweak func(*StickyConfig)) *Sticky {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Loads = loads
	cfg.Now = clk.now
	cfg.NoBackground = true
	cfg.Sticky.Enabled = true
	if tweak != nil {
		tweak(&cfg.Sticky)
	}
	p, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.(*Sticky).Close() })
	return p.(*Sticky)
}

func pick(t *testing.T, p Policy, ws []*worker.Worker, key, text string) (*worker.Worker, Decision) {
	t.Helper()
	req := &Request{Model: "m", Key: key, Text: text}
	w := p.Pick(context.Background(), ws, req)
	if w == nil {
		t.Fatalf("no worker for %q", key)
	}
	return w, req.Decision
}

// TestStickyKeepsSessionsOnRoundRobin: round_robin alone would move every turn; wrapped, every
// session keeps its first worker, keyless requests still rotate, and the decision counts add up.
func TestStickyKeepsSessionsOnRoundRobin(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	ws := cahWorkers(t, 4)
	p := newTestSticky(t, "round_robin", cahLoads{}, clk, nil)
	if p.Name() != "round_robin" {
		t.Fatalf("name %q, want the wrapped policy's", p.Name())
	}
	home := map[string]string{}
	for turn := 0; turn < 5; turn++ {
		for s := 0; s < 8; s++ {
			key := fmt.Sprintf("conv-%d", s)
			w, d := pick(t, p, ws, key, "")
			if turn == 0 {
				home[key] = w.ID
				continue
			}
			if w.ID != home[key] || d.Branch != BranchSticky {
				t.Fatalf("turn %d of %s went to %s (%q), want %s (sticky)", turn, key, w.ID, d.Branch, home[key])
			}
		}
		clk.advance(time.Second)
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		w, _ := pick(t, p, ws, "", "")
		seen[w.ID] = true
	}
	if len(seen) != 4 {
		t.Fatalf("keyless requests reached %d workers, want all 4 in turn", len(seen))
	}
	d := p.Decisions()
	if d[BranchSticky] != 32 || d[BranchStickyNew] != 8 || d[BranchPolicy] != 4 {
		t.Fatalf("decisions %v, want 32 sticky, 8 new and 4 by the policy", d)
	}
	// New sessions are placed by rendezvous order of their key: a second replica agrees.
	q := newTestSticky(t, "round_robin", cahLoads{}, clk, nil)
	for key, id := range home {
		if w, _ := pick(t, q, cahWorkers(t, 4), key, ""); w.ID != id {
			t.Fatalf("replicas placed %s on %s and %s", key, id, w.ID)
		}
	}
	if st := p.Sessions(); st.Active != 8 || st.Created != 8 {
		t.Fatalf("sessions %+v, want 8 active, 8 created", st)
	}
}

// TestStickyWorkerLeavesOnlyItsSessionsMove: when a worker leaves, its sessions move to their
// rendezvous successor and are bound there; every other session stays; two replicas that never
// talk move them alike; a worker that comes back does not pull its old sessions back.
func TestStickyWorkerLeavesOnlyItsSessionsMove(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	const n, sessions = 8, 400
	replicas := []*Sticky{
		newTestSticky(t, "round_robin", cahLoads{}, clk, nil),
		newTestSticky(t, "round_robin", cahLoads{}, clk, nil),
	}
	ws := [][]*worker.Worker{cahWorkers(t, n), cahWorkers(t, n)}
	home := map[string]string{}
	for s := 0; s < sessions; s++ {
		key := fmt.Sprintf("conv-%d", s)
		w, _ := pick(t, replicas[0], ws[0], key, "")
		home[key] = w.ID
		// The second replica learns the same binding by moving: bind it by hand to the same id.
		replicas[1].bind(key, w.ID, clk.now())
	}
	gone := ws[0][3].ID
	rest := [][]*worker.Worker{append(append([]*worker.Worker{}, ws[0][:3]...), ws[0][4:]...), append(append([]*worker.Worker{}, ws[1][:3]...), ws[1][4:]...)}
	moved, dest := 0, map[string]int{}
	for s := 0; s < sessions; s++ {
		key := fmt.Sprintf("conv-%d", s)
		w0, d0 := pick(t, replicas[0], rest[0], key, "")
		w1, _ := pick(t, replicas[1], rest[1], key, "")
		if w0.ID != w1.ID {
			t.Fatalf("replicas moved %s to %s and %s", key, w0.ID, w1.ID)
		}
		if home[key] != gone {
			if w0.ID != home[key] || d0.Branch != BranchSticky {
				t.Fatalf("%s moved from %s to %s although its worker stayed", key, home[key], w0.ID)
			}
			continue
		}
		moved++
		dest[w0.ID]++
		if d0.Branch != BranchStickyMoved {
			t.Fatalf("%s: branch %q, want %q", key, d0.Branch, BranchStickyMoved)
		}
		// Rendezvous order: the successor is the highest-scoring remaining worker.
		h := hashString(key)
		for _, w := range rest[0] {
			if score(h, w.ID) > score(h, w0.ID) {
				t.Fatalf("%s went to %s, but %s scores higher", key, w0.ID, w.ID)
			}
		}
		home[key] = w0.ID
	}
	if moved < sessions/n/2 || len(dest) < n-2 {
		t.Fatalf("%d sessions moved, to %d workers: want about %d spread over the other %d", moved, len(dest), sessions/n, n-1)
	}
	// The worker comes back (new object, same id): the moved sessions stay where they are now.
	back := cahWorkers(t, n)
	for s := 0; s < sessions; s++ {
		key := fmt.Sprintf("conv-%d", s)
		if w, _ := pick(t, replicas[0], back, key, ""); w.ID != home[key] {
			t.Fatalf("%s went back to %s after the worker returned, want it to stay on %s", key, w.ID, home[key])
		}
	}
}

// TestStickySaturation: a worker whose engine queues more than QueueRatio of its batch is
// saturated; its session spills to its rendezvous successor for that request only and comes
// back once the queue drains. Without a report, the cache_aware imbalance rule applies.
func TestStickySaturation(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	ws := cahWorkers(t, 4)
	loads := newFakeLoads()
	p := newTestSticky(t, "round_robin", loads, clk, nil)
	home, _ := pick(t, p, ws, "conv", "")
	next := p.successor(ws, "conv", home)

	// 8 running, 2 queued: a queue of a quarter batch is not yet saturation (2 ≤ 0.25 × 8).
	loads.mu.Lock()
	loads.reports[home] = loadmon.Report{Running: 8, Waiting: 2}
	loads.mu.Unlock()
	loads.set(home, 10)
	if w, d := pick(t, p, ws, "conv", ""); w != home || d.Branch != BranchSticky {
		t.Fatalf("at 8 running + 2 queued: went to %s (%q), want home %s", w.ID, d.Branch, home.ID)
	}
	loads.set(home, 11) // 3 queued > 2
	w, d := pick(t, p, ws, "conv", "")
	if w != next || d.Branch != BranchStickySaturated {
		t.Fatalf("saturated: went to %s (%q), want the successor %s", w.ID, d.Branch, next.ID)
	}
	loads.mu.Lock()
	delete(loads.reports, home)
	loads.mu.Unlock()
	loads.set(home, 3)
	if w, _ := pick(t, p, ws, "conv", ""); w != home {
		t.Fatalf("after the queue drained: went to %s, want home %s again", w.ID, home.ID)
	}
	// No report: saturated when 64 above the least loaded and more than 1.5 × it.
	loads.set(home, 70)
	if w, _ := pick(t, p, ws, "conv", ""); w != next {
		t.Fatalf("imbalanced without a report: went to %s, want the successor %s", w.ID, next.ID)
	}
	for _, w := range ws {
		loads.set(w, 200) // everyone saturated alike: stay home
	}
	if w, _ := pick(t, p, ws, "conv", ""); w != home {
		t.Fatalf("all loaded alike: went to %s, want home %s", w.ID, home.ID)
	}
	if d := p.Decisions(); d[BranchStickySaturated] != 2 {
		t.Fatalf("decisions %v, want 2 sticky_saturated", d)
	}
}

// TestStickyTTLAndLRU: a session silent for longer than TTL is placed afresh; past MaxSessions
// the least recently used session is dropped; a new binding and Sweep free expired sessions.
func TestStickyTTLAndLRU(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	ws := cahWorkers(t, 4)
	p := newTestSticky(t, "round_robin", cahLoads{}, clk, func(c *StickyConfig) {
		c.TTL, c.MaxSessions = time.Minute, 3
	})
	a, _ := pick(t, p, ws, "a", "")
	pick(t, p, ws, "b", "")
	pick(t, p, ws, "c", "")
	clk.advance(10 * time.Second)
	pick(t, p, ws, "a", "") // a is now the most recent: b is the least
	pick(t, p, ws, "d", "") // evicts b
	if st := p.Sessions(); st.Active != 3 || st.Evicted != 1 {
		t.Fatalf("after a fourth session: %+v, want 3 active, 1 evicted", st)
	}
	p.mu.Lock()
	_, _, hasB := p.sessions.Peek("b")
	p.mu.Unlock()
	if hasB {
		t.Fatal("b, the least recently used session, is still bound")
	}
	clk.advance(59 * time.Second)
	if w, d := pick(t, p, ws, "a", ""); w != a || d.Branch != BranchSticky {
		t.Fatalf("a after 59 s: %s (%q), want still bound to %s", w.ID, d.Branch, a.ID)
	}
	clk.advance(61 * time.Second)
	if _, d := pick(t, p, ws, "a", ""); d.Branch == BranchSticky {
		t.Fatal("a after 61 s of silence is still sticky, want it placed afresh")
	}
	// a's new binding dropped the expired c and d from the cold end, with no sweep.
	if st := p.Sessions(); st.Active != 1 || st.Expired != 3 {
		t.Fatalf("after a's new binding: %+v, want only a, 3 expired", st)
	}
	pick(t, p, ws, "e", "")
	clk.advance(2 * time.Minute)
	p.Sweep()
	if st := p.Sessions(); st.Active != 0 || st.Expired != 5 {
		t.Fatalf("after the sweep: %+v, want none, 5 expired", st)
	}
}

// TestStickyKeysAreBounded: a huge key is stored as a short hash and still sticks.
func TestStickyKeysAreBounded(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	ws := cahWorkers(t, 4)
	p := newTestSticky(t, "random", cahLoads{}, clk, nil)
	huge := strings.Repeat("k", 1<<20)
	w, _ := pick(t, p, ws, huge, "")
	for i := 0; i < 10; i++ {
		if w2, _ := pick(t, p, ws, huge, ""); w2 != w {
			t.Fatal("a long key did not stick")
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, _, _ := p.sessions.Oldest(); p.sessions.Len() != 1 || len(k) > MaxKeyBytes {
		t.Fatalf("the table holds %d sessions, one of a key of %d bytes", p.sessions.Len(), len(k))
	}
}

// TestStickyPerModelAndPrediction: the Router gives each model its own table, and a sticky pick
// around cache_aware still records the text in the tree and predicts the cached share.
func TestStickyPerModelAndPrediction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NoBackground = true
	cfg.Sticky.Enabled = true
	r, err := NewRouter("cache_aware", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.LoadAware() {
		t.Fatal("sticky sessions read load; the router must say so")
	}
	ws := cahWorkers(t, 4)
	pa, _ := r.For("a", worker.Regular)
	pb, _ := r.For("b", worker.Regular)
	if pa == pb {
		t.Fatal("two models share one policy")
	}
	text := sys + "first question"
	w, d := pick(t, pa, ws, "conv", text)
	if d.Branch != BranchStickyNew || !d.HasPrediction || d.Predicted != 0 {
		t.Fatalf("first turn: %+v, want a new session predicted to miss", d)
	}
	w2, d := pick(t, pa, ws, "conv", text+" and a second one")
	if w2 != w || d.Branch != BranchSticky || !d.HasPrediction || d.Predicted < 0.7 {
		t.Fatalf("second turn: %s %+v, want sticky on %s with most of the text predicted", w2.ID, d, w.ID)
	}
	if st := pb.(SessionReporter).Sessions(); st.Active != 0 {
		t.Fatalf("model b has %d sessions, want its own empty table", st.Active)
	}
	if sz := pa.(TreeReporter).TreeSizes(); sz[w.ID] == 0 {
		t.Fatal("the sticky pick did not record the text in cache_aware's tree")
	}
}

func BenchmarkStickyPick(b *testing.B) {
	clk := &clock{t: time.Unix(1000, 0)}
	cfg := DefaultConfig()
	cfg.Loads, cfg.Now, cfg.Sticky.Enabled = cahLoads{}, clk.now, true
	p, _ := New("round_robin", cfg)
	ws := make([]*worker.Worker, 16)
	for i := range ws {
		ws[i], _ = worker.New(worker.Spec{URL: fmt.Sprintf("http://e-%d:8000", i)}, worker.BreakerConfig{Disabled: true})
		ws[i].SetHealth(worker.Ready)
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("session-%d", i)
	}
	req := &Request{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Key = keys[i%len(keys)]
		p.Pick(context.Background(), ws, req)
	}
}

// TestStickyPolicyPlacement: with placement "policy" a new session goes where the wrapped
// policy sends it (cache_aware: the worker holding its prefix) and stays there.
func TestStickyPolicyPlacement(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	ws := cahWorkers(t, 4)
	p := newTestSticky(t, "cache_aware", cahLoads{}, clk, func(c *StickyConfig) { c.Placement = PlacePolicy })
	holder, _ := pick(t, p, ws, "", sys+"warm the tree")
	w, d := pick(t, p, ws, "conv", sys+"warm the tree, then ask")
	if w != holder || d.Branch != BranchCacheHit {
		t.Fatalf("new session: %s (%q), want the prefix holder %s by cache_hit", w.ID, d.Branch, holder.ID)
	}
	if w2, d := pick(t, p, ws, "conv", "something else entirely"); w2 != holder || d.Branch != BranchSticky {
		t.Fatalf("second turn: %s (%q), want sticky on %s", w2.ID, d.Branch, holder.ID)
	}
	cfg := DefaultConfig()
	cfg.Sticky.Placement = "nearest"
	if cfg.Validate() == nil {
		t.Fatal("an unknown placement was accepted")
	}
}
