package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// cahWorkers returns n ready workers; every call gives new objects with the same ids, as each
// gateway replica has its own.
func cahWorkers(t *testing.T, n int) []*worker.Worker {
	t.Helper()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://engine-%d:8000", i)}, worker.BreakerConfig{Disabled: true})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		ws[i] = w
	}
	return ws
}

// cahLoads is a fixed load per worker id.
type cahLoads map[string]int64

func (l cahLoads) Load(w *worker.Worker) int64                  { return l[w.ID] }
func (l cahLoads) Report(*worker.Worker) (loadmon.Report, bool) { return loadmon.Report{}, false }

func newCAH(t *testing.T, loads Loads) *CacheAwareHash {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Loads = loads
	cfg.NoBackground = true
	p, err := New("cache-aware-hash", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*CacheAwareHash)
}

func prompt(i int, tail string) string {
	return fmt.Sprintf("Tenant %d. ", i) + strings.Repeat(fmt.Sprintf("context of tenant %d ", i), 20) + tail
}

// TestCacheAwareHashReplicasAgree: replicas that never talk place a new prefix on the same
// worker, and a later request with the same opening and another tail follows it; different
// prefixes spread over the pool.
func TestCacheAwareHashReplicasAgree(t *testing.T) {
	const replicas, n = 8, 8
	pols := make([]*CacheAwareHash, replicas)
	ws := make([][]*worker.Worker, replicas)
	for r := range pols {
		pols[r], ws[r] = newCAH(t, cahLoads{}), cahWorkers(t, n)
	}
	used := map[string]int{}
	for i := 0; i < 200; i++ {
		first := pols[0].Pick(ws[0], &Request{Text: prompt(i, "question one")}).ID
		used[first]++
		for r := 1; r < replicas; r++ {
			if got := pols[r].Pick(ws[r], &Request{Text: prompt(i, fmt.Sprintf("question from replica %d", r))}).ID; got != first {
				t.Fatalf("prefix %d: replica %d chose %s, replica 0 chose %s", i, r, got, first)
			}
		}
		if again := pols[0].Pick(ws[0], &Request{Text: prompt(i, "another question")}).ID; again != first {
			t.Fatalf("prefix %d: follow-up went to %s, not the holder %s", i, again, first)
		}
	}
	if len(used) < n {
		t.Fatalf("200 prefixes used only %d of %d workers: %v", len(used), n, used)
	}
	for id, c := range used {
		if c > 50 {
			t.Fatalf("worker %s got %d of 200 prefixes", id, c)
		}
	}
	d := pols[0].Decisions()
	if d[BranchCacheMiss] != 200 || d[BranchCacheHit] != 200 {
		t.Fatalf("decisions %v, want 200 misses and 200 hits", d)
	}
}

// TestCacheAwareHashPlacement checks the miss branch against the load bounds: the owner keeps a
// new prefix as long as its load stays below mean + 3·√mean (the mean counting the new request)
// and within cache_aware's balance rule.
func TestCacheAwareHashPlacement(t *testing.T) {
	ws := cahWorkers(t, 4)
	text := prompt(7, "q")
	// The rendezvous order of the text over the four ids, with no load anywhere.
	order := func() []string {
		var ids []string
		loads := cahLoads{}
		for range ws {
			p := newCAH(t, loads)
			id := p.Pick(ws, &Request{Text: text}).ID
			ids = append(ids, id)
			loads[id] = 1000 // exclude it: far above the bound
		}
		return ids
	}()
	tests := []struct {
		name  string
		loads cahLoads
		want  string
	}{
		{"idle pool: the owner", cahLoads{}, order[0]},
		{"owner busier than the rest, within the bound: the owner", cahLoads{order[0]: 5, order[1]: 1}, order[0]},
		{"owner at mean + 3·√mean: skipped", cahLoads{order[0]: 12, order[1]: 2, order[2]: 2, order[3]: 2}, order[1]},
		{"owner beyond the balance bound: skipped", cahLoads{order[0]: 200, order[1]: 10, order[2]: 10, order[3]: 10}, order[1]},
		{"owner far above but within the absolute threshold: kept", cahLoads{order[0]: 60, order[1]: 61, order[2]: 61, order[3]: 0}, order[0]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := newCAH(t, tc.loads).Pick(ws, &Request{Text: text}).ID; got != tc.want {
				t.Fatalf("picked %s, want %s (rendezvous order %v)", got, tc.want, order)
			}
		})
	}
	if p := newCAH(t, cahLoads{}); p.Name() != "cache_aware_hash" || !LoadAware("cacheawarehash") {
		t.Fatal("registration: name or load awareness wrong")
	}
}

// queuedLoads is cahLoads whose workers in queued report waiting requests.
type queuedLoads struct {
	cahLoads
	queued map[string]bool
}

func (l queuedLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	if l.queued[w.ID] {
		return loadmon.Report{Running: 8, Waiting: 3}, true
	}
	return loadmon.Report{}, true
}

// TestCacheAwareHashPlacementTightensWhenSaturated: once any engine reports a queue (its batch or
// cache is full), a new prompt's owner must stay below mean + 1·√mean instead of 3·√mean.
func TestCacheAwareHashPlacementTightensWhenSaturated(t *testing.T) {
	ws := cahWorkers(t, 4)
	text := prompt(7, "q")
	owner := newCAH(t, cahLoads{}).Pick(ws, &Request{Text: text}).ID
	loads := cahLoads{}
	for _, w := range ws {
		loads[w.ID] = 2
	}
	loads[owner] = 7 // mean (13+1)/4 = 3.5: 7 < ⌈3.5+3·1.87⌉ = 10, but 7 ≥ ⌈3.5+1.87⌉ = 6
	if got := newCAH(t, queuedLoads{loads, nil}).Pick(ws, &Request{Text: text}).ID; got != owner {
		t.Fatalf("no queue anywhere: picked %s, want the owner %s", got, owner)
	}
	other := ws[0].ID
	if other == owner {
		other = ws[1].ID
	}
	if got := newCAH(t, queuedLoads{loads, map[string]bool{other: true}}).Pick(ws, &Request{Text: text}).ID; got == owner {
		t.Fatalf("an engine queues: the owner at load 7 still took the prompt")
	}
}

// TestCacheAwareHashSharedOpening: every prompt opens with the same 2,048-character system
// prompt, as every request of one application does. Hashing the opening would send every new
// prompt to one worker, held back only by the load bound; the placement key past the opening
// that several workers hold spreads them.
func TestCacheAwareHashSharedOpening(t *testing.T) {
	ws := cahWorkers(t, 8)
	p := newCAH(t, LocalLoads{})
	opening := strings.Repeat("You are a helpful assistant. ", 71)[:2048]
	got := map[string]int{}
	var inflight []func()
	for i := range 400 {
		// The opening is a quarter of the text, below the cache threshold, as in the Mooncake
		// trace (one 512-token block of an 8 KiB routing text).
		w := p.Pick(ws, &Request{Text: opening + prompt(i, strings.Repeat(fmt.Sprintf("question %d ", i), 500))})
		inflight = append(inflight, w.Acquire()) // four requests in flight at a time
		if len(inflight) > 4 {
			inflight[0]()
			inflight = inflight[1:]
		}
		got[w.ID]++
	}
	if len(got) != len(ws) {
		t.Fatalf("400 conversations used %d of %d workers: %v", len(got), len(ws), got)
	}
	for id, n := range got {
		if n > 100 { // 50 each when even
			t.Fatalf("worker %s took %d of 400 prompts behind one opening: %v", id, n, got)
		}
	}
}

func TestPlacementKey(t *testing.T) {
	text := strings.Repeat("abcdefgh", 1000)
	if k := placementKey(text, 0); k != text[:256] {
		t.Fatalf("nothing known: key of %d chars", len(k))
	}
	// Replicas whose trees know the same opening to within a few characters cut the same key.
	if placementKey(text, 2048) != placementKey(text, 2051) || len(placementKey(text, 2051)) != 2048+256 {
		t.Fatal("a chance match past the opening changed the key")
	}
}

// TestCacheAwareHashKeepsLongHitsWhenImbalanced: while the pool is imbalanced (one worker 100
// requests above the least), a prompt whose long context a worker within the balance rule holds
// still goes to that holder, not to the least loaded worker, where it would be a miss of the
// whole context. A short match, and a holder beyond the balance rule, give way to the least
// loaded worker as cache_aware does.
func TestCacheAwareHashKeepsLongHitsWhenImbalanced(t *testing.T) {
	ws := cahWorkers(t, 4)
	loads := cahLoads{ws[0].ID: 120, ws[1].ID: 20, ws[2].ID: 25, ws[3].ID: 30}
	long := strings.Repeat("the tenant's long shared context ", 128) // 4,224 characters
	short := "You are a helpful assistant. "
	for _, tc := range []struct {
		name   string
		text   string
		holder *worker.Worker
		want   *worker.Worker
	}{
		{"long context on a holder within balance: kept", long, ws[3], ws[3]},
		{"short match: the least loaded", short + strings.Repeat("x", 20), ws[3], ws[1]},
		{"long context on the overloaded worker: the least loaded", long, ws[0], ws[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCAH(t, loads)
			p.Record(&Request{Text: tc.text + " first question"}, tc.holder)
			req := &Request{Text: tc.text + " second question"}
			if got := p.Pick(ws, req); got != tc.want {
				t.Fatalf("picked %s, want %s (branch %q)", got.ID, tc.want.ID, req.Decision.Branch)
			}
			if tc.want == tc.holder && req.Decision.Branch != BranchCacheHit {
				t.Fatalf("kept on the holder but branch %q", req.Decision.Branch)
			}
			if tc.want != tc.holder && req.Decision.Branch != BranchImbalanced {
				t.Fatalf("sent to the least loaded but branch %q", req.Decision.Branch)
			}
		})
	}
	// cache_aware itself is unchanged: imbalanced means the least loaded.
	cfg := DefaultConfig()
	cfg.Loads, cfg.NoBackground = loads, true
	ca := NewCacheAware(cfg)
	defer ca.Close()
	ca.Record(&Request{Text: long + " first question"}, ws[3])
	if got := ca.Pick(ws, &Request{Text: long + " second question"}); got != ws[1] {
		t.Fatalf("cache_aware, imbalanced: picked %s, want the least loaded %s", got.ID, ws[1].ID)
	}
}
