package policy

import (
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// queueLoads gives each worker a request load and a fresh report of 8 running requests, with the
// given waiting requests, from a poll estimating `replicas` gateways; every engine decodes at one
// pace but `slow`, at a third of it.
type queueLoads struct {
	load     map[string]int64
	waiting  map[string]int64
	replicas float64
	slow     string
}

func (l queueLoads) Load(w *worker.Worker) int64 { return l.load[w.ID] }
func (l queueLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	gen := 800.0
	if w.ID == l.slow {
		gen /= 3
	}
	return loadmon.Report{Running: 8, Waiting: l.waiting[w.ID], GenThroughput: gen,
		PolledAt: backlogPoll, Replicas: l.replicas}, true
}

// TestCacheAwareHashLeastOnQueue: behind one gateway, on a uniform fleet of small batches where
// an engine queues, a new prompt goes to the least loaded worker, not its rendezvous owner. With
// no queue, with several gateways (replicas must agree on owners), or on a fleet whose engines
// decode at different paces, the owner keeps it.
func TestCacheAwareHashLeastOnQueue(t *testing.T) {
	ws := cahWorkers(t, 4)
	text := prompt(5, "a new conversation")
	owner := newCAH(t, cahLoads{}).Pick(ws, &Request{Text: text}).ID
	var least string
	load := map[string]int64{}
	for _, w := range ws {
		load[w.ID] = 8
		if w.ID != owner && least == "" {
			least = w.ID
		}
	}
	load[owner], load[least] = 9, 7 // the owner is within the bound (mean + √mean ≈ 11.1)
	queued := map[string]int64{owner: 2}

	pick := func(l queueLoads) string { return newCAH(t, l).Pick(ws, &Request{Text: text}).ID }
	if got := pick(queueLoads{load: load, waiting: queued, replicas: 1}); got != least {
		t.Fatalf("one gateway, an engine queues: picked %s, want the least loaded %s (owner %s)", got, least, owner)
	}
	if got := pick(queueLoads{load: load, replicas: 1}); got != owner {
		t.Fatalf("one gateway, no queue: picked %s, want the owner %s", got, owner)
	}
	if got := pick(queueLoads{load: load, waiting: queued, replicas: 8}); got != owner {
		t.Fatalf("8 gateways, an engine queues: picked %s, want the owner %s (replicas must agree)", got, owner)
	}
	if got := pick(queueLoads{load: load, waiting: queued, replicas: 1, slow: least}); got != owner {
		t.Fatalf("one gateway, engines of different pace: picked %s, want the owner %s", got, owner)
	}
	// A hit is unchanged: a queued holder still saves the prefill.
	p := newCAH(t, queueLoads{load: load, replicas: 1})
	holder := p.Pick(ws, &Request{Text: text}).ID
	p.loads = queueLoads{load: load, waiting: map[string]int64{holder: 2}, replicas: 1}
	if got := p.Pick(ws, &Request{Text: text + " and its next turn"}).ID; got != holder {
		t.Fatalf("hit on a queued holder: picked %s, want the holder %s", got, holder)
	}
}
