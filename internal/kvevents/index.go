package kvevents

import (
	"slices"
	"sync"
	"time"
)

// Block keys. The index does not replicate any engine's hash function: it keys a block by the
// token ids the events carry, chained over every block before it, so that a request tokenized
// the same way gets the same keys. Engine hashes only link a stored block to its parent.

const keySeed = 0x6a09e667f3bcc908

// seedFor returns the chain seed of a LoRA adapter (hasLoRA false: the base model).
func seedFor(lora int64, hasLoRA bool) uint64 {
	if !hasLoRA {
		return keySeed
	}
	return mix(keySeed, uint64(lora)+1)
}

// mix folds w into h: a multiply-xorshift step (a bijection of h for a given w).
func mix(h, w uint64) uint64 {
	h = (h ^ w) * 0x9e3779b97f4a7c15
	return h ^ h>>31
}

// chainBlock returns the key of the block of toks whose parent block has key h.
func chainBlock(h uint64, toks []uint32) uint64 {
	i := 0
	for ; i+1 < len(toks); i += 2 {
		h = mix(h, uint64(toks[i])|uint64(toks[i+1])<<32)
	}
	if i < len(toks) {
		h = mix(h, uint64(toks[i]))
	}
	return mix(h, 0xffffffff00000000|uint64(len(toks)))
}

// BlockKeys appends to dst the keys of the full blocks of bs tokens of a base-model prompt and
// returns it.
func BlockKeys(dst []uint64, toks []uint32, bs int) []uint64 {
	h := uint64(keySeed)
	for i := 0; i+bs <= len(toks); i += bs {
		h = chainBlock(h, toks[i:i+bs])
		dst = append(dst, h)
	}
	return dst
}

// Source identifies one event stream: a worker, the model its topic names ("" when it names
// none) and a data-parallel rank.
type Source struct {
	Worker string
	Model  string
	Rank   int
}

// holder is what the index knows of one source's cache.
type holder struct {
	src  Source
	slot int32
	// blocks maps an engine block hash to the index key of that block.
	blocks map[uint64]uint64
	// extra counts, per key, the engine hashes beyond the first that map to it (blocks whose
	// tokens match but whose hashes differ, as extra keys such as images make them), so that
	// removing one does not unlink a key another still holds. Rarely non-empty.
	extra map[uint64]int32
	// order lists engine hashes oldest first (from head), for the memory bound; an entry whose
	// block was removed since is skipped when reached.
	order []uint64
	head  int
	bs    int
	// worker is the share of the index of src.Worker.
	worker *workerBlocks
	// readyAt is when the holder's picture is trusted again after it was dropped.
	readyAt time.Time
	// loraIDOnly says the stream stored an adapter's blocks by id alone (lora.go).
	loraIDOnly bool
}

// Index is what every engine's prefix cache holds, rebuilt from its events: per source, engine
// hash → block key, and per block key the sources holding it. Safe for concurrent use: events
// are applied under a write lock, matches take a read lock.
//
// Memory: a block costs about BytesPerBlock bytes (measured: TestIndexBytesPerBlock), and a
// worker holds at most maxBlocks blocks over all its sources, so one worker costs at most
// about maxBlocks × BytesPerBlock.
type Index struct {
	maxBlocks  int
	maxSources int

	mu      sync.RWMutex
	sources map[Source]*holder
	slots   []*holder          // slot → holder; nil when free
	byKey   map[uint64][]int32 // block key → slots holding it
	workers map[string]*workerBlocks
	orphans uint64
	evicted uint64
}

// workerBlocks is one worker's share of the index.
type workerBlocks struct {
	holders []*holder
	blocks  int // over all its holders
}

// BytesPerBlock is what one indexed block costs in memory, in bytes, at most (measured by
// TestIndexBytesPerBlock, maps at their fullest and emptiest; about 90 on average).
const BytesPerBlock = 160

// NewIndex returns an empty index that keeps at most maxBlocks blocks per worker over all its
// sources (the oldest stored go first past it) and at most maxSources sources per worker.
func NewIndex(maxBlocks, maxSources int) *Index {
	return &Index{maxBlocks: maxBlocks, maxSources: maxSources, sources: map[Source]*holder{},
		byKey: map[uint64][]int32{}, workers: map[string]*workerBlocks{}}
}

// holderFor returns src's holder, creating it unless the worker has maxSources already.
func (x *Index) holderFor(src Source) *holder {
	if h := x.sources[src]; h != nil {
		return h
	}
	wb := x.workers[src.Worker]
	if wb == nil {
		wb = &workerBlocks{}
		x.workers[src.Worker] = wb
	}
	if len(wb.holders) >= x.maxSources {
		return nil
	}
	h := &holder{src: src, blocks: map[uint64]uint64{}, worker: wb}
	wb.holders = append(wb.holders, h)
	h.slot = int32(slices.Index(x.slots, nil))
	if h.slot < 0 {
		h.slot = int32(len(x.slots))
		x.slots = append(x.slots, nil)
	}
	x.slots[h.slot] = h
	x.sources[src] = h
	return h
}

// Expect registers src as a connected stream that holds nothing yet, so that matches can answer
// for its worker (0 tokens) before it stores its first block.
func (x *Index) Expect(src Source) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.holderFor(src)
}

// Apply applies a batch's events from src in order.
func (x *Index) Apply(src Source, events []Event) {
	x.mu.Lock()
	defer x.mu.Unlock()
	h := x.holderFor(src)
	if h == nil {
		return
	}
	for i := range events {
		x.apply(h, &events[i])
	}
}

func (x *Index) apply(h *holder, e *Event) {
	switch e.Kind {
	case BlockStored:
		key := storedSeed(e) // lora.go
		h.noteAdapter(e)
		if e.Salted {
			key = saltSeed(key, e.Salt)
		}
		if e.HasParent {
			k, ok := h.blocks[e.Parent]
			if !ok {
				// The parent is unknown (evicted here, or stored before we listened): these
				// blocks cannot be keyed from the start of a prompt, so no match reaches them.
				x.orphans++
				return
			}
			key = k
		}
		if h.bs != 0 && h.bs != e.BlockSize {
			// A stream whose block size changed: what it said before cannot be matched with
			// what it says now.
			x.clear(h)
		}
		h.bs = e.BlockSize
		for i, hash := range e.Hashes {
			key = chainBlock(key, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
			x.store(h, hash, key)
		}
	case BlockRemoved:
		for _, hash := range e.Hashes {
			x.remove(h, hash)
		}
	case AllBlocksCleared:
		x.clear(h)
	}
}

func (x *Index) store(h *holder, hash, key uint64) {
	old, had := h.blocks[hash]
	if had && old == key {
		return
	}
	if had {
		x.unlink(h, old)
	} else {
		h.worker.blocks++
	}
	h.blocks[hash] = key
	if ks := x.byKey[key]; !slices.Contains(ks, h.slot) {
		x.byKey[key] = append(ks, h.slot)
	} else {
		// Another of h's hashes maps to key already.
		if h.extra == nil {
			h.extra = map[uint64]int32{}
		}
		h.extra[key]++
	}
	h.order = append(h.order, hash)
	for h.worker.blocks > x.maxBlocks {
		x.evictOldest(h)
	}
	h.compact()
}

// evictOldest drops the oldest block of the fullest source of h's worker (h when it is as full
// as any): the bound is per worker, and a stream that fills it evicts from itself before it
// evicts from its worker's other ranks.
func (x *Index) evictOldest(h *holder) {
	for _, o := range h.worker.holders {
		if len(o.blocks) > len(h.blocks) {
			h = o
		}
	}
	for h.head < len(h.order) {
		old := h.order[h.head]
		h.head++
		if _, ok := h.blocks[old]; ok {
			x.remove(h, old)
			x.evicted++
			return
		}
	}
}

// compact drops the order list's dead head once it outgrows the live part.
func (h *holder) compact() {
	if h.head <= len(h.blocks)+1024 {
		return
	}
	live := h.order[:0]
	for _, hash := range h.order[h.head:] {
		if _, ok := h.blocks[hash]; ok {
			live = append(live, hash)
		}
	}
	h.order, h.head = slices.Clip(live), 0
}

func (x *Index) remove(h *holder, hash uint64) {
	key, ok := h.blocks[hash]
	if !ok {
		return
	}
	delete(h.blocks, hash)
	h.worker.blocks--
	x.unlink(h, key)
}

// unlink drops h from the holders of key, unless another of h's hashes still maps to it.
func (x *Index) unlink(h *holder, key uint64) {
	if n := h.extra[key]; n > 0 {
		if n == 1 {
			delete(h.extra, key)
		} else {
			h.extra[key] = n - 1
		}
		return
	}
	ks := x.byKey[key]
	i := slices.Index(ks, h.slot)
	if i < 0 {
		return
	}
	if len(ks) == 1 {
		delete(x.byKey, key)
		return
	}
	x.byKey[key] = slices.Delete(ks, i, i+1)
}

func (x *Index) clear(h *holder) {
	h.extra = nil
	for _, key := range h.blocks {
		x.unlink(h, key)
	}
	h.worker.blocks -= len(h.blocks)
	h.blocks = map[uint64]uint64{}
	h.order, h.head = nil, 0
	h.bs = 0
}

// Reset drops what src holds and distrusts the source until 'until': a match involving its
// worker fails until then (the caller falls back to the prefix tree) while fresh events rebuild
// the picture.
func (x *Index) Reset(src Source, until time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h := x.holderFor(src); h != nil {
		x.clear(h)
		h.readyAt = until
	}
}

// Forget drops every source of worker.
func (x *Index) Forget(worker string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if wb := x.workers[worker]; wb != nil {
		for _, h := range slices.Clone(wb.holders) {
			x.drop(h)
		}
	}
}

// Drop forgets one source: what it holds, and that it exists (so that Covers and Match no
// longer count on it).
func (x *Index) Drop(src Source) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h := x.sources[src]; h != nil {
		x.drop(h)
	}
}

func (x *Index) drop(h *holder) {
	x.clear(h)
	delete(x.sources, h.src)
	x.slots[h.slot] = nil
	wb := h.worker
	wb.holders = slices.DeleteFunc(wb.holders, func(o *holder) bool { return o == h })
	if len(wb.holders) == 0 {
		delete(x.workers, h.src.Worker)
	}
}

// IndexStats are the index's counters.
type IndexStats struct {
	// Sources is the number of event streams known; Blocks the blocks they hold in all.
	Sources, Blocks int
	// Orphans counts stored events dropped for an unknown parent; Evicted the blocks dropped
	// by the per-source bound.
	Orphans, Evicted uint64
}

// Stats returns the index's counters.
func (x *Index) Stats() IndexStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := IndexStats{Sources: len(x.sources), Orphans: x.orphans, Evicted: x.evicted}
	for _, h := range x.sources {
		s.Blocks += len(h.blocks)
	}
	return s
}

// Covers reports whether Match can answer for every worker now: each has an event stream
// (for model, or naming no model) and none is being resynchronized. It lets a caller skip the
// tokenization when the answer would be no.
func (x *Index) Covers(model string, workers []string, now time.Time) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, w := range workers {
		if _, ok := x.holdersOf(nil, model, w, now); !ok {
			return false
		}
	}
	return true
}

// holdersOf appends to dst the streams of worker for model (or naming no model); ok is false
// when it has none or one is being resynchronized. Callers hold mu.
func (x *Index) holdersOf(dst []*holder, model, worker string, now time.Time) (_ []*holder, ok bool) {
	wb := x.workers[worker]
	if wb == nil {
		return dst, false
	}
	for _, h := range wb.holders {
		if h.src.Model != "" && h.src.Model != model {
			continue
		}
		if now.Before(h.readyAt) {
			return dst, false
		}
		dst, ok = append(dst, h), true
	}
	return dst, ok
}

// Match writes to out[i] the number of leading tokens of toks that worker workers[i] holds for
// model, the longest over its data-parallel ranks, in whole blocks. It reports false, leaving
// out undefined, when the index cannot answer for every worker: one has no event stream yet or
// is being resynchronized. Streams of different block sizes are matched each at its own (one
// walk of the prompt per size), so that one stream's odd block size — an engine configured
// differently, or a malformed stream — changes nothing for the others. now is the current time.
func (x *Index) Match(model string, toks []uint32, workers []string, out []int, now time.Time) bool {
	return x.match(model, keySeed, toks, workers, out, now, false) == len(workers)
}

// CoversAny reports whether MatchEach can answer for at least one of workers now.
func (x *Index) CoversAny(model string, workers []string, now time.Time) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, w := range workers {
		if _, ok := x.holdersOf(nil, model, w, now); ok {
			return true
		}
	}
	return false
}

// MatchEach is Match for each worker on its own: out[i] is −1 for a worker the index cannot
// answer for (no event stream yet, or one being resynchronized), and the others are matched as
// Match does. It returns how many workers it answered for.
func (x *Index) MatchEach(model string, toks []uint32, workers []string, out []int, now time.Time) int {
	return x.match(model, keySeed, toks, workers, out, now, true)
}

// MatchSalted is Match for a prompt with a cache salt of digest salt (SaltDigest): it meets only
// the blocks stored under that salt.
func (x *Index) MatchSalted(model string, salt uint64, toks []uint32, workers []string, out []int, now time.Time) bool {
	return x.match(model, saltSeed(keySeed, salt), toks, workers, out, now, false) == len(workers)
}

// match is Match, MatchSalted (seed: the blocks' key seed) and MatchEach. It returns how many
// workers it answered for; each false stops at the first it cannot answer
// for (Match), each true marks that one −1 and goes on (MatchEach).
func (x *Index) match(model string, seed uint64, toks []uint32, workers []string, out []int, now time.Time, each bool) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var hbuf [16]*holder
	var obuf [16]int
	var sbuf [4]int
	hs, owner, sizes := hbuf[:0], obuf[:0], sbuf[:0] // hs[j] belongs to workers[owner[j]]
	answered := 0
	for i, w := range workers {
		out[i] = 0
		n := len(hs)
		var ok bool
		if hs, ok = x.holdersOf(hs, model, w, now); !ok {
			if !each {
				return answered
			}
			hs, out[i] = hs[:n], -1
			continue
		}
		answered++
		for _, h := range hs[n:] {
			owner = append(owner, i)
			if h.bs != 0 && !slices.Contains(sizes, h.bs) {
				sizes = append(sizes, h.bs)
			}
		}
	}
	var abuf [16]bool
	alive := abuf[:0]
	if len(hs) > len(abuf) {
		alive = make([]bool, 0, len(hs))
	}
	for _, bs := range sizes {
		x.walk(bs, seed, toks, hs, owner, out, alive)
	}
	return answered
}

// walk extends out with the blocks of bs tokens that the holders of that block size hold from
// the start of toks. Callers hold mu.
func (x *Index) walk(bs int, seed uint64, toks []uint32, hs []*holder, owner, out []int, alive []bool) {
	alive = alive[:0]
	left := 0
	for _, h := range hs {
		alive = append(alive, h.bs == bs)
		if h.bs == bs {
			left++
		}
	}
	key := seed
	for b := 0; (b+1)*bs <= len(toks) && left > 0; b++ {
		key = chainBlock(key, toks[b*bs:(b+1)*bs])
		slots := x.byKey[key]
		for j, h := range hs {
			if !alive[j] {
				continue
			}
			if !slices.Contains(slots, h.slot) {
				alive[j] = false
				left--
				continue
			}
			out[owner[j]] = max(out[owner[j]], (b+1)*bs)
		}
	}
}
