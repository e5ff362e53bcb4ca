package policy

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestCacheAwareHashPassesPrefillingOwner: behind several gateways on a decode-bound fleet, a new
// prompt passes over its owner while this replica has a request there awaiting its first byte,
// and goes to the next worker in its rendezvous order that has none; once that request has its
// first byte, the owner takes the prompt again. Behind one gateway the rotation decides instead;
// on small batches, or once the engines report much more cached than this replica predicted
// (other replicas place the conversations it sees), the owner keeps the prompt.
func TestCacheAwareHashPassesPrefillingOwner(t *testing.T) {
	ws := cahWorkers(t, 8)
	load := evenLoads(ws, 60)
	text := prompt(7, "a new question")
	owner := newCAH(t, rotLoads{load, 64, 8, nil}).Pick(ws, &Request{Text: text})

	p := newCAH(t, rotLoads{load, 64, 8, nil})
	first, release := owner.Track()
	defer release()
	next := p.Pick(ws, &Request{Text: text})
	if next == owner {
		t.Fatalf("the owner %s was prefilling this replica's request and still took the new prompt", owner.ID)
	}
	// The next in rendezvous order is the owner with the owner out of the pool.
	var rest []*worker.Worker
	for _, w := range ws {
		if w != owner {
			rest = append(rest, w)
		}
	}
	if want := newCAH(t, rotLoads{load, 64, 8, nil}).Pick(rest, &Request{Text: text}); next != want {
		t.Fatalf("passed over to %s, want the next in rendezvous order %s", next.ID, want.ID)
	}
	// Every worker prefilling: the rendezvous order decides as before.
	for _, w := range ws {
		if w != owner {
			_, r := w.Track()
			defer r()
		}
	}
	if got := newCAH(t, rotLoads{load, 64, 8, nil}).Pick(ws, &Request{Text: text}); got != owner {
		t.Fatalf("with every worker prefilling the prompt went to %s, want its owner %s", got.ID, owner.ID)
	}
	for _, w := range ws {
		w.Track() // hold one more in every one, then free only the owner's first
	}
	first()
	if owner.Awaiting() != 1 {
		t.Fatalf("owner awaiting %d after one first byte of two", owner.Awaiting())
	}

	fresh := cahWorkers(t, 8)
	var owner2 *worker.Worker
	for _, tc := range []struct {
		name   string
		loads  rotLoads
		unpred float64 // reported − predicted share, observed 1,000 times
		passes bool
	}{
		{"eight gateways, decode-bound", rotLoads{load, 64, 8, nil}, 0.05, true},
		{"eight gateways, small batches", rotLoads{load, 2, 8, nil}, 0, false},
		{"eight gateways, the engines hold much more than predicted", rotLoads{load, 64, 8, nil}, 0.3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range fresh {
				tc.loads.load[w.ID] = 60
			}
			p := newCAH(t, tc.loads)
			owner2 = newCAH(t, tc.loads).Pick(fresh, &Request{Text: text})
			for range 1000 {
				p.Observed(0.5, 0.5+tc.unpred)
			}
			_, r := owner2.Track()
			defer r()
			got := p.Pick(fresh, &Request{Text: text})
			if tc.passes == (got == owner2) {
				t.Fatalf("went to %s (owner %s, prefilling): passes over %v, want %v", got.ID, owner2.ID, got != owner2, tc.passes)
			}
		})
	}
}

// TestObservedAverage: the unpredicted share is a moving average of reported − predicted, with
// hostile values (beyond [0,1], NaN) clamped.
func TestObservedAverage(t *testing.T) {
	p := newCAH(t, rotLoads{})
	for range 5 * unpredictedWindow {
		p.Observed(0.1, 0.6)
	}
	if math.Abs(p.unpred.avg-0.5) > 0.01 || !p.othersPlace() {
		t.Fatalf("average %v after many 0.5 differences", p.unpred.avg)
	}
	for range 5 * unpredictedWindow {
		p.Observed(math.NaN(), 7) // clamped to 0 and 1
	}
	if math.Abs(p.unpred.avg-1) > 0.01 {
		t.Fatalf("average %v after clamped differences of 1", p.unpred.avg)
	}
	for range 5 * unpredictedWindow {
		p.Observed(1, -3)
	}
	if p.unpred.avg > -0.95 || p.othersPlace() {
		t.Fatalf("average %v after differences of -1", p.unpred.avg)
	}
}
