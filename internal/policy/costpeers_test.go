package policy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/worker"
)

var _ Peers = (*replicasync.Node)(nil)

// syncedReplica is one gateway replica for the peer tests: its own workers (the same URLs, so
// the same ids), a fixed fresh report for each, its own default policy and sync Node.
type syncedReplica struct {
	ws   []*worker.Worker
	node *replicasync.Node
	pol  *Cost
}

func newSyncedReplica(t *testing.T, n int, now func() time.Time, polled time.Time) *syncedReplica {
	t.Helper()
	node, err := replicasync.NewNode(replicasync.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	r := &syncedReplica{ws: testWorkers(t, n), node: node}
	lv := reportLoads{}
	for _, w := range r.ws {
		lv[w] = struct {
			load int64
			r    loadmon.Report
			ok   bool
		}{0, loadmon.Report{PolledAt: polled, GenThroughput: 1000, HasTokenData: true, HasUncachedTokens: true, Replicas: 1}, true}
	}
	r.pol = NewCacheAwareHash(Config{Loads: lv, Now: now, NoBackground: true, Peers: peersOrNil(node)})
	t.Cleanup(func() { r.pol.Close() })
	return r
}

func (r *syncedReplica) pick(t *testing.T, text string) (*worker.Worker, Decision) {
	t.Helper()
	req := &Request{Model: "m", Text: text, PromptBytes: len(text)}
	w := Choose(context.Background(), r.pol, r.ws, req)
	if w == nil {
		t.Fatal("no pick")
	}
	return w, req.Decision
}

// sync delivers every batch of from to to.
func syncTo(t *testing.T, from, to *syncedReplica) {
	t.Helper()
	if err := from.node.Flush(func(b []byte) error { return to.node.Apply(b) }); err != nil {
		t.Fatal(err)
	}
}

// TestPeersPlacementKeepsOnePrompt is the fault the sync plane fixes: two replicas that each
// place a new prompt hold it twice. With the first replica's decision applied, the second
// sends the same prompt to the same worker, predicting it cached there; without it, the second
// replica's Ĉ for it is the owner's guess only.
func TestPeersPlacementKeepsOnePrompt(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	a, b := newSyncedReplica(t, 4, clock, now.Add(-time.Millisecond)), newSyncedReplica(t, 4, clock, now.Add(-time.Millisecond))
	// a places 8 new prompts in a burst, spreading them by what it sent since the report.
	placed := make([]string, 8)
	for i := range placed {
		w, _ := a.pick(t, strings.Repeat(string(rune('a'+i)), 3000))
		placed[i] = w.ID
	}
	syncTo(t, a, b)
	for i, want := range placed {
		wb, d := b.pick(t, strings.Repeat(string(rune('a'+i)), 3000)+" a follow-up")
		if wb.ID != want {
			t.Errorf("prompt %d: replica a placed it on %s, b sent its follow-up to %s", i, want, wb.ID)
		}
		if d.Chosen.Cached < 700 {
			t.Errorf("prompt %d: b predicts %.0f tokens cached, want the peer's placement (~750)", i, d.Chosen.Cached)
		}
	}
}

// TestPeersSendsAreS: what a peer sent a worker since its report is S, exactly (not this
// replica's sends times the replica estimate), and the audit terms say how much came from peers.
func TestPeersSendsAreS(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	polled := now.Add(-time.Millisecond)
	a, b := newSyncedReplica(t, 2, clock, polled), newSyncedReplica(t, 2, clock, polled)
	a.node.Decided("m", a.ws[0].ID, "", "", 4000)
	syncTo(t, a, b)
	_, d := b.pick(t, strings.Repeat("q", 400))
	if d.Chosen.Worker == a.ws[0].ID {
		t.Errorf("b chose the worker a just sent 4000 tokens: %v", d.Chosen)
	}
	if d.RunnerUp.PeerSent < 3000 || d.RunnerUp.Sent < d.RunnerUp.PeerSent {
		t.Errorf("runner-up terms %v: want S ≈ 4000 less what it prefilled since, all of it from peers", d.RunnerUp)
	}
	if !strings.Contains(d.RunnerUp.String(), " sp=") {
		t.Errorf("audit terms %q do not say S's part from peers", d.RunnerUp.String())
	}
	// The bus down: the routing falls back to the estimate, reading nothing from peers.
	b.node.SetUp(false)
	_, d = b.pick(t, strings.Repeat("r", 400))
	if d.Chosen.PeerSent != 0 || d.RunnerUp.PeerSent != 0 {
		t.Errorf("with the bus down, S still read peers: %v / %v", d.Chosen, d.RunnerUp)
	}
}

func peersOrNil(n *replicasync.Node) Peers {
	if testNoPeers {
		return nil
	}
	return n
}

var testNoPeers = false
var _ SessionShare = (*replicasync.Node)(nil)

// BenchmarkDecisionWithPeers times a default-policy decision on 64 workers without replica sync
// and with it (a Node holding 3 peers' last 3,000 decisions, the decision published and its
// batch flushed), in the same run: the sync's cost on the decision path (target: within 10 %).
// on-other-prompts has the peers place other prompts; the -spread pair starts both from one
// tree (each prompt held by one worker) instead of the warm-up's own picks. Each reports what
// the tree holds, since the descent's cost follows the holders the picks made.
//
//	go test -run XXX -bench DecisionWithPeers ./internal/policy/
func BenchmarkDecisionWithPeers(b *testing.B) {
	texts := mooncakeTexts()
	ws, mon := monitoredFleet(b, 64)
	// on-unblind: sync on with the blind term off (costblind.go). Back to back, every decision
	// falls within the blind window of the previous ones: the term's worst case.
	for _, mode := range []string{"off", "on", "on-unblind", "on-other-prompts", "off-spread", "on-spread"} {
		sync := strings.HasPrefix(mode, "on")
		b.Run(mode, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.NoBackground, cfg.Loads = true, mon
			if mode == "on-unblind" {
				cfg.Cost.BlindWindow = 0
			}
			var node *replicasync.Node
			if sync {
				var err error
				node, err = replicasync.NewNode(replicasync.Config{})
				if err != nil {
					b.Fatal(err)
				}
				for k := range 3 {
					peer, _ := replicasync.NewNode(replicasync.Config{})
					for i := range 1000 {
						text := texts[(i*3+k)%len(texts)]
						if mode == "on-other-prompts" {
							text = "another conversation " + text
						}
						peer.Decided("m", ws[(i+k)%len(ws)].ID, text, "", 1000)
					}
					_ = peer.Flush(func(m []byte) error { return node.Apply(m) })
				}
				cfg.Peers = node
			}
			p := NewCacheAwareHash(cfg)
			defer p.Close()
			for i := range texts {
				if strings.HasSuffix(mode, "-spread") {
					// The same tree with sync off and on: each prompt held by one worker, the
					// opening by all, so that the pair times the sync plane alone.
					p.tree.Insert(texts[i], ws[i%len(ws)].ID)
					continue
				}
				Choose(context.Background(), p, ws, &Request{Model: "m", Text: texts[i], PromptBytes: 40000})
			}
			req := &Request{}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				*req = Request{Model: "m", Text: texts[i%len(texts)], PromptBytes: 40000}
				if Choose(context.Background(), p, ws, req) == nil {
					b.Fatal("no pick")
				}
				if node != nil && i%16 == 0 {
					_ = node.Flush(func([]byte) error { return nil })
				}
				i++
			}
			// What this replica's tree holds, over every worker, and how many workers hold the
			// prompts' shared opening: the tree's descent calls back once per holder of each
			// node it passes, so the routing the picks made is part of a decision's cost.
			var held int64
			for _, n := range p.tree.Sizes() {
				held += n
			}
			_, holders := p.tree.Lookup(texts[0][:2048])
			b.ReportMetric(float64(held)/1e6, "Mchars-held")
			b.ReportMetric(float64(len(holders)), "opening-holders")
		})
	}
}

// TestPeersSendsArePrefilled: what peers sent since the report is prefilled at μ like this
// replica's own sends: a second after a report of an idle engine, 4,000 tokens a peer sent it
// are done (μ 8,000 tokens/s) and S is 0.
func TestPeersSendsArePrefilled(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	polled := now.Add(-time.Second)
	a, b := newSyncedReplica(t, 1, clock, polled), newSyncedReplica(t, 1, clock, polled)
	a.node.Decided("m", a.ws[0].ID, "", "", 4000)
	syncTo(t, a, b)
	if _, d := b.pick(t, strings.Repeat("q", 400)); d.Chosen.Sent != 0 || d.Chosen.PeerSent != 0 {
		t.Errorf("terms %v: a second at 8,000 tokens/s prefilled the peer's 4,000, want S 0", d.Chosen)
	}
}

// chainCounter is a Peers that counts how often a decision hashes its routing text.
type chainCounter struct {
	*replicasync.Node
	chains int
}

func (c *chainCounter) Chain(dst []uint64, text string) ([]uint64, uint64) {
	c.chains++
	return c.Node.Chain(dst, text)
}

// TestPeersChainHashedOnce: a decision hashes its routing text once, for the peer-placement
// lookup and the published decision both, and what it publishes places the prompt for a peer
// exactly as hashing the text anew would.
func TestPeersChainHashedOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	a, b := newSyncedReplica(t, 4, clock, now.Add(-time.Millisecond)), newSyncedReplica(t, 4, clock, now.Add(-time.Millisecond))
	cc := &chainCounter{Node: a.node}
	a.pol.sc.peers = cc
	text := strings.Repeat("a long shared conversation ", 300) // 8,100 bytes: 31 chunks and a tail
	w, _ := a.pick(t, text)
	if cc.chains != 1 {
		t.Errorf("one decision hashed its routing text %d times, want 1", cc.chains)
	}
	syncTo(t, a, b)
	out := make([]int, len(b.ws))
	ids := make([]string, len(b.ws))
	for i, x := range b.ws {
		ids[i] = x.ID
	}
	b.node.Placed("m", text, ids, out)
	for i, x := range b.ws {
		if want := map[bool]int{true: len(text)}[x.ID == w.ID]; out[i] != want {
			t.Errorf("peer sees %d bytes placed on %s, want %d (a chose %s)", out[i], x.ID, want, w.ID)
		}
	}
}
