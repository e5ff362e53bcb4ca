package policy

import (
	"context"
	"math"
	"slices"

	"github.com/kvgate/kvgate/internal/worker"
)

// Both hashing policies use rendezvous (highest-random-weight) hashing: a key goes to the
// available worker with the highest score(key, worker id). It needs no ring to build or keep in
// sync with the worker set, it depends only on the key and the ids (so every gateway replica
// decides alike), and adding a worker moves only the keys the newcomer now wins, about 1/N.
// Unavailable workers are simply skipped: their keys go to their second choice and come back
// when they return. The hash is our own fixed function (below): stable across processes,
// versions and architectures, unlike hash/maphash's per-process seed.

// hashString returns a 64-bit hash of s, eight bytes per step (a 1 KB prefix is hashed on every
// prefix_hash decision; byte-at-a-time FNV took over a microsecond). Little-endian word loads
// keep the result the same on every architecture.
func hashString(s string) uint64 {
	const m = 0x9e3779b97f4a7c15
	h := uint64(len(s)) * m
	for ; len(s) >= 8; s = s[8:] {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = (h ^ w) * m
		h ^= h >> 32
	}
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * m
		h ^= h >> 32
	}
	return mix64(h)
}

// mix64 is splitmix64's finalizer: every input bit flips about half the output bits.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// score is worker id's rendezvous weight for a key hash, mixed so that the order of workers is
// independent from key to key.
func score(key uint64, id string) uint64 { return scoreHashed(key, idHash(id)) }

// idHash is the part of score that depends on the worker id alone, for callers that keep it.
func idHash(id string) uint64 { return hashString(id) * 0x9e3779b97f4a7c15 }

// scoreHashed is score with the id's idHash.
func scoreHashed(key, idh uint64) uint64 { return mix64(key ^ idh) }

// ConsistentHashing sends every request with the same routing key (Request.Key: the
// x-kvgate-routing-key header, else another identity header) to the same worker while it is
// available. Requests without a key go to a random available worker. Create it with
// NewConsistentHashing; the zero value is not usable.
type ConsistentHashing struct {
	rand func(int) int
	dec  *counters
}

var (
	_ Policy           = (*ConsistentHashing)(nil)
	_ DecisionReporter = (*ConsistentHashing)(nil)
)

const (
	chHash = iota
	chNoKey
)

// NewConsistentHashing returns a ConsistentHashing policy using cfg.Rand for keyless requests.
func NewConsistentHashing(cfg Config) *ConsistentHashing {
	return &ConsistentHashing{rand: cfg.withDefaults().Rand, dec: newCounters(BranchHash, BranchNoKey)}
}

// Name returns "consistent_hashing".
func (*ConsistentHashing) Name() string { return "consistent_hashing" }

// Decisions returns decisions by branch: hash, no_key.
func (p *ConsistentHashing) Decisions() map[string]uint64 { return p.dec.snapshot() }

// Pick returns the available worker with the highest rendezvous score for req.Key, or a random
// available worker when the key is empty.
func (p *ConsistentHashing) Pick(_ context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
	if req.Key == "" {
		var buf [64]*worker.Worker
		av := available(buf[:0], candidates)
		if len(av) == 0 {
			return nil
		}
		p.dec.add(chNoKey)
		req.decide(BranchNoKey, 0, false)
		return av[p.rand(len(av))]
	}
	key := hashString(req.Key)
	var best *worker.Worker
	var bestScore uint64
	for _, w := range candidates {
		if !w.Available() {
			continue
		}
		if s := score(key, w.ID); best == nil || s > bestScore {
			best, bestScore = w, s
		}
	}
	if best != nil {
		p.dec.add(chHash)
		req.decide(BranchHash, 0, false)
	}
	return best
}

// PrefixHash sends requests whose routing texts share their first PrefixChars characters to the
// same worker, with bounded load: a worker that would go above LoadFactor × the mean load hands
// the key on to its next choice. It keeps no state, so every gateway replica maps a prefix to the
// same worker (given the same loads) without talking to the others. Create it with
// NewPrefixHash; the zero value is not usable.
type PrefixHash struct {
	cfg   PrefixHashConfig
	loads Loads
	dec   *counters
}

var (
	_ Policy           = (*PrefixHash)(nil)
	_ DecisionReporter = (*PrefixHash)(nil)
)

const (
	phHash = iota
	phOverflow
	phNoKey
)

// NewPrefixHash returns a PrefixHash policy reading cfg.Loads.
func NewPrefixHash(cfg Config) *PrefixHash {
	c := cfg.withDefaults()
	return &PrefixHash{cfg: c.PrefixHash, loads: c.Loads, dec: newCounters(BranchHash, BranchHashOverflow, BranchNoKey)}
}

// Name returns "prefix_hash".
func (*PrefixHash) Name() string { return "prefix_hash" }

// Decisions returns decisions by branch: hash, hash_overflow, no_key.
func (p *PrefixHash) Decisions() map[string]uint64 { return p.dec.snapshot() }

// Pick hashes the first PrefixChars characters of req.Text (req.Key when the text is empty) and
// walks the available workers in rendezvous order, returning the first whose load is below the
// bound ⌈LoadFactor × (total load + 1) / n⌉: the mean counts the request being placed, and the
// ceiling guarantees that some worker fits. With nothing to hash it returns the least loaded.
func (p *PrefixHash) Pick(_ context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
	var buf [64]cand
	av, minI := gatherLoads(buf[:0], candidates, p.loads)
	if len(av) == 0 {
		return nil
	}
	var total int64
	for i := range av {
		total += av[i].load
	}
	k := prefixChars(req.Text, p.cfg.PrefixChars)
	if k == "" {
		k = req.Key
	}
	if k == "" {
		p.dec.add(phNoKey)
		req.decide(BranchNoKey, 0, false)
		return av[minI].w
	}
	key := hashString(k)
	bound := int64(math.Ceil(p.cfg.LoadFactor * float64(total+1) / float64(len(av))))
	first := 0
	var sbuf [64]uint64
	scores := sbuf[:0]
	for i := range av {
		scores = append(scores, score(key, av[i].w.ID))
		if scores[i] > scores[first] {
			first = i
		}
	}
	if av[first].load < bound {
		p.dec.add(phHash)
		req.decide(BranchHash, 0, false)
		return av[first].w
	}
	p.dec.add(phOverflow)
	req.decide(BranchHashOverflow, 0, false)
	order := make([]int, len(av))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	for _, i := range order {
		if av[i].load < bound {
			return av[i].w
		}
	}
	return av[minI].w // unreachable while the bound holds; kept for safety against odd loads
}

// prefixChars returns the first n characters of s; like the prefix tree, it counts an invalid
// UTF-8 byte as one character.
func prefixChars(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for i < n && s[i] < 0x80 { // ASCII: one byte, one character
		i++
	}
	if i == n {
		return s[:n]
	}
	n -= i
	for j := range s[i:] {
		if n == 0 {
			return s[:i+j]
		}
		n--
	}
	return s
}
