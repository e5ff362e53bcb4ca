package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// rotLoads gives each worker a fixed request load and a fresh report of `running` requests from
// a poll round that estimated `replicas` gateways, generating 1,000 tokens/s, or 400 for the
// workers in slow.
type rotLoads struct {
	load     map[string]int64
	running  int64
	replicas float64
	slow     map[string]bool
}

func (l rotLoads) Load(w *worker.Worker) int64 { return l.load[w.ID] }
func (l rotLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	gen := 1000.0
	if l.slow[w.ID] {
		gen = 400
	}
	return loadmon.Report{Running: l.running, GenThroughput: gen, HasTokenData: true, PolledAt: backlogPoll, Replicas: l.replicas}, true
}

// evenLoads returns a request load of n for every worker of ws.
func evenLoads(ws []*worker.Worker, n int64) map[string]int64 {
	load := make(map[string]int64, len(ws))
	for _, w := range ws {
		load[w.ID] = n
	}
	return load
}

// hotPrompt is a system prompt every worker holds, with a short unique question: a hit on all.
func hotPrompt(i int) string {
	return strings.Repeat("You are the support assistant of ACME. ", 40) + fmt.Sprintf("question %d", i)
}

// warmAll records the hot system prompt for every worker, as after each took one such request.
func warmAll(p *CacheAwareHash, ws []*worker.Worker) {
	for i, w := range ws {
		p.Record(&Request{Text: hotPrompt(-1 - i)}, w)
	}
}

// TestCacheAwareHashRotatesHotHolders: a prompt every worker holds goes, on a decode-bound fleet,
// round the holders instead of to the least loaded one each time. Least loaded would send a
// whole run of arrivals to the worker that just finished a cohort (here: 10 requests below the
// others), whose prefills would then share its steps and stall its batch. With small batches,
// or engines of different speeds (round robin is for identical servers), the least loaded
// holder takes it, as before.
func TestCacheAwareHashRotatesHotHolders(t *testing.T) {
	ws := cahWorkers(t, 8)
	load := evenLoads(ws, 60)
	load[ws[3].ID] = 50 // a cohort just finished there
	for _, tc := range []struct {
		name    string
		loads   rotLoads
		rotates bool
	}{
		{"one gateway, decode-bound: rotation", rotLoads{load, 64, 1, nil}, true},
		{"eight gateways, decode-bound: rotation (hits do not move owners)", rotLoads{load, 64, 8, nil}, true},
		{"one gateway, small batches: least loaded", rotLoads{load, 2, 1, nil}, false},
		{"eight gateways, small batches: least loaded", rotLoads{load, 2, 8, nil}, false},
		{"one engine decodes at 40 % of the pace: least loaded", rotLoads{load, 64, 1, map[string]bool{ws[5].ID: true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCAH(t, tc.loads)
			warmAll(p, ws)
			got := map[string]int{}
			for i := range len(ws) {
				req := &Request{Text: hotPrompt(i)}
				w := p.Pick(ws, req)
				if req.Decision.Branch != BranchCacheHit {
					t.Fatalf("pick %d: branch %q, want a hit", i, req.Decision.Branch)
				}
				got[w.ID]++
			}
			if tc.rotates && len(got) != len(ws) {
				t.Fatalf("8 hits on a prompt all 8 workers hold went to %d workers: %v", len(got), got)
			}
			if !tc.rotates && got[ws[3].ID] != len(ws) {
				t.Fatalf("the least loaded holder %s took %d of 8 hits: %v", ws[3].ID, got[ws[3].ID], got)
			}
		})
	}
}

// TestCacheAwareHashRotationBound: the rotation passes over a holder at or above the placement
// bound (mean + 3·√mean), however long ago it was picked; when every holder is above it, the
// least loaded holder takes the hit.
func TestCacheAwareHashRotationBound(t *testing.T) {
	ws := cahWorkers(t, 4)
	load := map[string]int64{ws[0].ID: 100, ws[1].ID: 40, ws[2].ID: 40, ws[3].ID: 40}
	p := newCAH(t, rotLoads{load, 64, 1, nil})
	warmAll(p, ws)
	for i := range 12 {
		if w := p.Pick(ws, &Request{Text: hotPrompt(i)}); w == ws[0] {
			t.Fatalf("pick %d went to %s at load 100, above the bound (mean 55)", i, w.ID)
		}
	}
	// One holder only, far above the bound: it still takes its hit.
	only := newCAH(t, rotLoads{load, 64, 1, nil})
	only.Record(&Request{Text: hotPrompt(-1)}, ws[0])
	if w := only.Pick(ws, &Request{Text: hotPrompt(1)}); w != ws[0] {
		t.Fatalf("the only holder was passed over for %s", w.ID)
	}
}

// TestCacheAwareHashRotatesNewPrompts: behind one gateway on a decode-bound fleet, new prompts
// go round the workers this replica picked least recently, so a run of them spreads over the
// pool; with several gateways they go to their hash owner whatever this replica picked last, so
// that replicas keep agreeing on owners.
func TestCacheAwareHashRotatesNewPrompts(t *testing.T) {
	ws := cahWorkers(t, 8)
	load := evenLoads(ws, 60)
	solo := newCAH(t, rotLoads{load, 64, 1, nil})
	got := map[string]int{}
	for i := range len(ws) {
		got[solo.Pick(ws, &Request{Text: prompt(i, "q")}).ID]++
	}
	if len(got) != len(ws) {
		t.Fatalf("8 new prompts at one gateway went to %d workers: %v", len(got), got)
	}
	solo.Forget(ws[0].ID)
	if solo.recent.lastOf(ws[0].ID) != 0 {
		t.Fatal("Forget left the worker's last pick")
	}

	// Eight replicas: each new prompt goes to its owner at every replica, whatever each replica
	// picked before it.
	a, b := newCAH(t, rotLoads{load, 64, 8, nil}), newCAH(t, rotLoads{load, 64, 8, nil})
	for i := range 3 * len(ws) {
		b.Pick(ws, &Request{Text: prompt(1000+i, "other traffic at replica b")})
	}
	for i := range 2 * len(ws) {
		text := prompt(i, "q")
		if x, y := a.Pick(ws, &Request{Text: text}), b.Pick(ws, &Request{Text: text}); x != y {
			t.Fatalf("prompt %d: replicas chose %s and %s", i, x.ID, y.ID)
		}
	}
}

// TestCacheAwareHashNewPromptsRoundRobin: behind one gateway on a decode-bound fleet, new
// prompts go round robin over the workers within the bounds, round after round: each to the
// worker this replica picked least recently. Ordering them by rendezvous score once every worker
// had been picked within the round sent the next one to its owner, a random worker, which then
// took two picks in one round. A worker above the placement bound is left out of the round.
func TestCacheAwareHashNewPromptsRoundRobin(t *testing.T) {
	ws := cahWorkers(t, 8)
	load := evenLoads(ws, 60)
	p := newCAH(t, rotLoads{load, 64, 1, nil})
	var order []*worker.Worker
	for i := range 4 * len(ws) {
		order = append(order, p.Pick(ws, &Request{Text: prompt(i, "q")}))
	}
	for i := len(ws); i < len(order); i++ {
		if order[i] != order[i-len(ws)] {
			t.Fatalf("new prompt %d went to %s, want %s (picked least recently, %d picks before)",
				i, order[i].ID, order[i-len(ws)].ID, len(ws))
		}
	}

	// A hit counts as a pick: the new prompt after it skips the worker the hit took.
	warmAll(p, ws)
	h := p.Pick(ws, &Request{Text: hotPrompt(1)})
	if w := p.Pick(ws, &Request{Text: prompt(100, "q")}); w == h {
		t.Fatalf("the new prompt after a hit on %s went to the same worker", h.ID)
	}

	// Above the bound (mean + 3·√mean, about 87 here): never picked, however long ago.
	load[ws[2].ID] = 200
	for i := range 2 * len(ws) {
		if w := p.Pick(ws, &Request{Text: prompt(200+i, "q")}); w == ws[2] {
			t.Fatalf("new prompt %d went to %s at load 200, above the bound", i, w.ID)
		}
	}
}

func TestRecent(t *testing.T) {
	var r picks
	for _, id := range []string{"a", "b", "c"} {
		r.picked(id)
	}
	seq, gap := r.window(2)
	if recent(r.lastOf("a"), seq, gap) || !recent(r.lastOf("b"), seq, gap) || !recent(r.lastOf("c"), seq, gap) {
		t.Fatalf("window of 2 after a, b, c: a %d b %d c %d seq %d", r.lastOf("a"), r.lastOf("b"), r.lastOf("c"), seq)
	}
	if recent(r.lastOf("never"), seq, gap) {
		t.Fatal("a worker never picked counts as recent")
	}
}
