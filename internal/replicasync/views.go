package replicasync

import (
	"sort"
	"time"
)

// workerLog is what peers sent one worker, as cumulative sums stamped at receipt, so that the
// sum since any moment is two lookups. Bounded to Window entries each; past it the oldest fold
// into the base.
type workerLog struct {
	id    string
	heard int64  // Unix ns of the last record about it
	born  uint64 // Node.gen when the index was given to this worker
	sends cumRing
	fins  cumRing
}

// cumRing is a ring of (time, cumulative value) pairs in time order.
//
// It also keeps what was added after one moment (the last one asked by sinceKept: the
// engine's last report, the same for every decision until the next), updated as entries
// arrive, so that a decision reads it without a search. The values added are whole numbers
// (tokens, requests), so the kept sum equals since's difference of cumulative sums exactly.
type cumRing struct {
	at    []int64
	cum   []float64
	head  int // index of the oldest entry
	total float64
	base  float64 // the cumulative value before the oldest entry

	keptAt  int64   // the moment kept (Unix ns), when kept
	keptSum float64 // since(keptAt)
	keptN   int     // the entries after keptAt
	kept    bool
}

func (r *cumRing) add(at int64, v float64, window int) {
	r.total += v
	n := len(r.at)
	if n > 0 {
		if last := r.at[(r.head+n-1)%n]; at < last {
			at = last // receipt times only move forward
		}
	}
	if r.kept {
		if n >= window && r.keptN == n {
			// The oldest entry, after keptAt, is about to fold into the base: since no longer
			// counts it.
			r.keptSum -= r.cum[r.head] - r.base
			r.keptN--
		}
		if at > r.keptAt {
			r.keptSum += v
			r.keptN++
		} else { // every entry is at or before keptAt
			r.keptSum, r.keptN = 0, 0
		}
	}
	if n < window { // still growing: the oldest is at 0
		r.at = append(r.at, at)
		r.cum = append(r.cum, r.total)
		return
	}
	r.base = r.cum[r.head]
	r.at[r.head], r.cum[r.head] = at, r.total
	r.head = (r.head + 1) % n
}

// since returns what was added after t (Unix ns).
func (r *cumRing) since(t int64) float64 {
	n := len(r.at)
	// The number of entries at or before t, by binary search over the ring in time order.
	k := sort.Search(n, func(i int) bool { return r.at[(r.head+i)%n] > t })
	if k == 0 {
		return r.total - r.base
	}
	return r.total - r.cum[(r.head+k-1)%n]
}

// sinceKept returns since(t) and the number of entries after t, from what is kept when t is
// the moment kept, and keeps t otherwise (one search when the engine's report moves on).
func (r *cumRing) sinceKept(t int64) (float64, int) {
	if !r.kept || r.keptAt != t {
		r.keptAt, r.keptSum, r.keptN, r.kept = t, r.since(t), len64(*r, t), true
	}
	return r.keptSum, r.keptN
}

func (l *workerLog) send(at int64, tokens float64, window int) { l.sends.add(at, tokens, window) }
func (l *workerLog) finish(at int64, window int)               { l.fins.add(at, 1, window) }

// placement is one model's peer-placement view: chunk hash → the workers (up to slotWorkers)
// peers placed the prefix it stands for on, bounded by a FIFO of insertions.
type placement struct {
	m    map[uint64]slot
	fifo []placed
	head int
	max  int
}

const slotWorkers = 4

type slot struct {
	w   [slotWorkers]uint16 // worker index + 1; 0 is empty
	gen [slotWorkers]uint64
}

type placed struct {
	h   uint64
	w   uint16
	gen uint64
}

func newPlacement(max int) *placement {
	return &placement{m: make(map[uint64]slot, min(max, 1<<12)), max: max}
}

func (p *placement) insert(h uint64, w uint16, gen uint64) {
	s := p.m[h]
	k := -1
	for i := range s.w {
		if s.w[i] == w+1 {
			k = i
			break
		}
	}
	if k < 0 {
		k = 0
		for i := range s.w {
			if s.w[i] == 0 {
				k = i
				break
			}
			if s.gen[i] < s.gen[k] {
				k = i
			}
		}
	}
	s.w[k], s.gen[k] = w+1, gen
	p.m[h] = s
	e := placed{h: h, w: w, gen: gen}
	if len(p.fifo) < p.max {
		p.fifo = append(p.fifo, e)
		return
	}
	old := p.fifo[p.head]
	p.fifo[p.head] = e
	p.head = (p.head + 1) % len(p.fifo)
	if o, ok := p.m[old.h]; ok {
		empty := true
		for i := range o.w {
			if o.w[i] == old.w+1 && o.gen[i] == old.gen {
				o.w[i], o.gen[i] = 0, 0
			}
			empty = empty && o.w[i] == 0
		}
		if empty {
			delete(p.m, old.h)
		} else {
			p.m[old.h] = o
		}
	}
}

// SentSince returns what peers sent worker since t, as received here: the uncached tokens
// (capped by MaxPeerSent) and the requests (their decisions less their finishes; negative when
// more finished than were sent since t). Both are 0 for a worker no peer mentioned.
func (n *Node) SentSince(worker string, t time.Time) (tokens, requests float64) {
	at := t.UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	i, ok := n.workers[worker]
	if !ok {
		return 0, 0
	}
	l := n.logs[i]
	return min(l.sends.since(at), n.cfg.MaxPeerSent), float64(len64(l.sends, at)) - l.fins.since(at)
}

// SentSinceAll is SentSince for many workers under one lock: tokens[i] and requests[i] are what
// peers sent workers[i] since since[i]; the four slices are equally long.
func (n *Node) SentSinceAll(workers []string, since []time.Time, tokens, requests []float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, id := range workers {
		tokens[k], requests[k] = 0, 0
		i, ok := n.workers[id]
		if !ok {
			continue
		}
		l, at := n.logs[i], since[k].UnixNano()
		sent, count := l.sends.sinceKept(at)
		fins, _ := l.fins.sinceKept(at)
		tokens[k], requests[k] = min(sent, n.cfg.MaxPeerSent), float64(count)-fins
	}
}

// len64 is the number of sends after at (each send adds one entry).
func len64(r cumRing, at int64) int {
	n := len(r.at)
	k := sort.Search(n, func(i int) bool { return r.at[(r.head+i)%n] > at })
	return n - k
}

// Placed writes to out[i] the bytes of text's leading prefix that a peer placed on workers[i]
// for model (a multiple of ChunkBytes, or len(text) when a peer placed this very text), 0 where
// none did; out is as long as workers.
func (n *Node) Placed(model, text string, workers []string, out []int) {
	var sb [128]uint64
	bounds, whole := n.chain.Boundaries(sb[:0], text)
	n.PlacedChain(model, bounds, whole, len(text), workers, out)
}

// PlacedChain is Placed for a text of textLen bytes already hashed by Chain (bounds and whole
// as it returned them).
func (n *Node) PlacedChain(model string, bounds []uint64, whole uint64, textLen int, workers []string, out []int) {
	clear(out)
	if textLen == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	pl := n.models[model]
	if pl == nil || len(pl.m) == 0 {
		return
	}
	// at[w] is worker index w's first position in workers, plus one (0: not a candidate), so
	// that a placement finds its candidate without a search; idx, each candidate's index.
	if len(n.candAt) < len(n.logs) {
		n.candAt = make([]int32, n.cfg.MaxWorkers)
	}
	at, idx := n.candAt, n.candIdx[:0]
	dup := false
	for c, id := range workers {
		i, ok := n.workers[id]
		if !ok {
			i = noWorker
		} else if at[i] == 0 {
			at[i] = int32(c + 1)
		} else {
			dup = true
		}
		idx = append(idx, i)
	}
	n.candIdx = idx
	defer func() {
		for _, i := range idx {
			if i != noWorker {
				at[i] = 0
			}
		}
	}()
	left := len(workers)
	look := func(h uint64, chars int) {
		s, ok := pl.m[h]
		if !ok {
			return
		}
		for k := range s.w {
			if s.w[k] == 0 || s.gen[k] < n.logs[s.w[k]-1].born {
				continue
			}
			if c := at[s.w[k]-1] - 1; c >= 0 && out[c] == 0 {
				out[c] = chars
				left--
			}
		}
	}
	if whole != 0 {
		look(whole, textLen)
	}
	for i := len(bounds) - 1; i >= 0 && left > 0; i-- {
		look(bounds[i], (i+1)*ChunkBytes)
	}
	if dup { // a worker named twice has its first position's answer
		for c, i := range idx {
			if i != noWorker {
				out[c] = out[at[i]-1]
			}
		}
	}
}

// noWorker is PlacedChain's index for a candidate no peer mentioned.
const noWorker = 1<<16 - 1

// affinityTable maps a keyed key hash to the worker a peer bound it to, bounded by a FIFO.
type affinityTable struct {
	m    map[uint64]bound
	fifo []uint64
	head int
}

type bound struct {
	w    uint16
	at   int64
	born uint64 // the worker index's born when bound: a recycled index no longer matches
}

func newAffinityTable(hint int) *affinityTable {
	return &affinityTable{m: make(map[uint64]bound, hint)}
}

func (t *affinityTable) put(key uint64, w uint16, born uint64, at int64, max int) {
	if _, ok := t.m[key]; !ok {
		if len(t.fifo) < max {
			t.fifo = append(t.fifo, key)
		} else {
			delete(t.m, t.fifo[t.head])
			t.fifo[t.head] = key
			t.head = (t.head + 1) % len(t.fifo)
		}
	}
	t.m[key] = bound{w: w, at: at, born: born}
}

// Affinity returns the worker a peer bound key of namespace ns to (NSResponse, NSSession)
// within AffinityTTL, ok false when none did.
func (n *Node) Affinity(ns byte, key string) (worker string, ok bool) {
	if int(ns) >= len(n.affinity) || ns == 0 {
		return "", false
	}
	k := n.keyHash(ns, key)
	now := n.cfg.Now().UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.affinity[ns].m[k]
	if !ok || now-b.at > int64(n.cfg.AffinityTTL) {
		return "", false
	}
	if l := n.logs[b.w]; l.born == b.born {
		return l.id, true
	}
	return "", false
}

// BindSession shares a sticky-session binding (policy.SessionShare).
func (n *Node) BindSession(key, worker string) { n.Bound(NSSession, key, "", worker) }

// SessionWorker returns the worker a peer bound a sticky session to (policy.SessionShare).
func (n *Node) SessionWorker(key string) (string, bool) { return n.Affinity(NSSession, key) }
