package policy

import (
	"math"

	"github.com/kvgate/kvgate/internal/radix"
)

// The tree's capacity per worker, learned from the answers. An engine's prefix cache keeps a
// prefix until, least recently used first, the blocks it cached since push it out: about C
// tokens after it last served it, C its cache. The tree cannot know C (an engine reports its
// KV usage, not what it would evict next, and behind several gateways each replica sees only
// its share of the traffic), but every answer shows it: each worker's tree has a clock that
// runs by the tokens the worker's answers report newly cached (prompt − cached), every record
// keeps the clock of its last send, and a decision records how old, on that clock, the chosen
// worker's deepest record on the prompt's path was (radix.Prior). The answer then says whether
// the engine still held that record (it reported at least the record's prefix cached) or not.
//
// Each worker keeps, per band of ages (capBands to an octave), how many of its answers showed
// such a record held and how many lost (moving sums over learnWindow answers). Its capacity is
// the youngest age of a band with a loss past which the records were mostly lost: at least
// capLostRatio times as many losses as hits among every answer at that age or older, and at
// least capMinLosses of them. A loss here and there
// (a prompt sent twice before its first prefill ended looks like one; an engine under memory
// pressure preempts) sets no capacity while hits at greater ages outweigh it. The tree hides
// a worker's records older than its capacity (radix.Tree.SetLimit), so a prompt the engine
// evicted stops pulling requests to it at about the time the engine lets it go.

// capBands is the resolution of the learned capacity: bands of ages per octave.
const capBands = 2

// capBandCount covers ages up to radix.MaxLimit tokens.
const capBandCount = 31 * capBands

// capLostRatio is how many times the hits the losses past a capacity must weigh: engines under
// memory pressure lose prefixes of every age (preemption), and a capacity learned from that
// hides records the engine still holds more often than not.
const capLostRatio = 3

// capMinLosses is the least weight of lost records past a capacity: one loss is not a pattern.
const capMinLosses = 3

// capFloorTokens is the least capacity learned, in tokens: a few cache blocks, as the slack of
// the tree's correction (an engine that keeps less than that keeps nothing worth routing by).
const capFloorTokens = correctSlackTokens

// capacities keeps each worker's evidence and learned capacity, in tokens of its answers'
// clock.
type capacities struct{ perWorker[capEvidence] }

// capEvidence is one worker's answers by age band: held[i] and lost[i] weigh the answers whose
// record's age fell in band i, [capEdge(i), capEdge(i+1)).
type capEvidence struct {
	held, lost [capBandCount]float32
	n          int
	limit      float64
}

// capBand returns the band of age (≥ 1).
func capBand(age float64) int {
	return min(max(int(math.Log2(max(age, 1))*capBands), 0), capBandCount-1)
}

// capEdge returns the youngest age of band i.
func capEdge(i int) float64 { return math.Exp2(float64(i) / capBands) }

// observe records that worker's engine held (or not) a record of age tokens, and returns its
// capacity, 0 while none was learned.
func (c *capacities) observe(worker string, age float64, held bool) (limit float64) {
	c.update(worker, func(e *capEvidence) {
		e.add(age, held)
		limit = e.limit
	})
	return limit
}

// add records one answer and learns the capacity again.
func (e *capEvidence) add(age float64, held bool) {
	if e.n >= learnWindow {
		k := float32(1 - 1.0/learnWindow)
		for i := range e.held {
			e.held[i] *= k
			e.lost[i] *= k
		}
	} else {
		e.n++
	}
	if b := capBand(age); held {
		e.held[b]++
	} else {
		e.lost[b]++
	}
	e.limit = 0
	var h, l float32
	loss := -1 // the youngest band at or past i with a loss
	for i := capBandCount - 1; i >= 0; i-- {
		h, l = h+e.held[i], l+e.lost[i]
		if e.lost[i] > 0 {
			loss = i
		}
		if l >= capLostRatio*h && l >= capMinLosses {
			e.limit = min(max(capEdge(loss), capFloorTokens), radix.MaxLimit)
		}
	}
}

// limit returns worker's learned capacity, 0 while none was learned.
func (c *capacities) limit(worker string) (limit float64) {
	c.read(worker, func(e *capEvidence) { limit = e.limit })
	return limit
}

// snapshot returns worker → its learned capacity, in tokens, for the workers that have one.
func (c *capacities) snapshot() map[string]float64 {
	return each(&c.perWorker, func(e *capEvidence) (float64, bool) { return e.limit, e.limit > 0 })
}

// CapacityReporter is implemented by policies that learn each worker's cache capacity.
type CapacityReporter interface {
	// Capacities returns worker id → the tokens its engine was shown to keep (§8.1 of
	// docs/routing.md); a worker is absent until an answer showed it lost a prefix.
	Capacities() map[string]float64
}

// Capacities returns each worker's learned capacity (CapacityReporter).
func (p *Cost) Capacities() map[string]float64 { return p.capacity.snapshot() }

// learnCapacity is the part of Learn that teaches the tree's capacity for the answering worker:
// heldChars is how much of the routing text the engine held, in its characters (with the
// correction's slack), newTokens the tokens the answer shows the engine newly cached.
func (p *Cost) learnCapacity(b *Basis, worker string, heldChars int, newTokens float64) {
	if b.PriorChars > 0 && b.PriorAge > 0 {
		limit := p.capacity.observe(worker, b.PriorAge, heldChars >= b.PriorChars)
		p.tree.SetLimit(worker, int64(limit))
	}
	p.tree.Advance(worker, int64(newTokens))
}
