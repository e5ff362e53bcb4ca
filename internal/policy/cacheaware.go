package policy

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/radix"
	"github.com/kvgate/kvgate/internal/worker"
)

// Branch names, as reported by Decisions: which way a policy decided.
const (
	// BranchCacheHit: cache_aware sent the request to a worker holding its prefix.
	BranchCacheHit = "cache_hit"
	// BranchCacheMiss: cache_aware found no prefix worth following and took the least loaded.
	BranchCacheMiss = "cache_miss"
	// BranchImbalanced: the pool was imbalanced, so cache_aware took the least loaded.
	BranchImbalanced = "imbalanced"
	// BranchHashOverflow: the hashed worker was over its load bound; the next one took the key.
	BranchHashOverflow = "hash_overflow"
	// BranchHash: the request went to the worker its key hashes to.
	BranchHash = "hash"
	// BranchNoKey: the request had nothing to hash (no routing key, no text); consistent_hashing
	// chose at random and prefix_hash took the least loaded.
	BranchNoKey = "no_key"
)

// DecisionReporter is implemented by policies that count their decisions by branch; the
// gateway's metrics collector reads it at scrape time.
type DecisionReporter interface {
	// Decisions returns branch name → decisions taken so far. Every branch the policy can take
	// is present, zero included.
	Decisions() map[string]uint64
}

// TreeReporter is implemented by policies that keep a prefix tree.
type TreeReporter interface {
	// TreeSizes returns worker id → characters the tree records for it.
	TreeSizes() map[string]int64
}

// counters counts decisions per branch. The zero value is ready; it must not be copied.
type counters struct {
	names []string
	n     []atomic.Uint64
}

func newCounters(names ...string) *counters {
	return &counters{names: names, n: make([]atomic.Uint64, len(names))}
}

// add counts one decision for branch i (an index into names).
func (c *counters) add(i int) { c.n[i].Add(1) }

func (c *counters) snapshot() map[string]uint64 {
	out := make(map[string]uint64, len(c.names))
	for i, name := range c.names {
		out[name] = c.n[i].Load()
	}
	return out
}

// cand is one available worker seen by a pick, with its load and candidate index.
type cand struct {
	w    *worker.Worker
	load int64
	idx  int
}

// gatherLoads appends to dst the available candidates with their effective loads (idx is the
// position in candidates) and returns them with the index of the least loaded by lessLoaded. It
// is the candidate-gathering step that the load-aware policies share.
func gatherLoads(dst []cand, candidates []*worker.Worker, loads Loads) (av []cand, minI int) {
	av = dst
	for i, w := range candidates {
		if !w.Available() {
			continue
		}
		av = append(av, cand{w: w, load: loads.Load(w), idx: i})
		if last := len(av) - 1; last > 0 && lessLoaded(&av[last], &av[minI]) {
			minI = last
		}
	}
	return av, minI
}

// lessLoaded orders candidates by load, then requests processed, then candidate index. The
// processed count spreads ties when decode outpaces prefill and loads read zero.
func lessLoaded(a, b *cand) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	if pa, pb := a.w.Processed(), b.w.Processed(); pa != pb {
		return pa < pb
	}
	return a.idx < b.idx
}

// CacheAware routes a request to the worker most likely to hold its prompt prefix in KV cache,
// unless the pool is imbalanced (DESIGN.md §1, §3). It keeps one prefix tree (one policy serves
// one model) and, unless Config.NoBackground, one goroutine that trims the tree every
// EvictionInterval until Close. Create it with NewCacheAware; the zero value is not usable.
type CacheAware struct {
	cfg   CacheAwareConfig
	loads Loads
	tree  *radix.Tree
	dec   *counters
	kv    bool // a KV-usage trigger is on
	// placeMiss, when set, chooses the worker for a prompt no worker holds enough of (given the
	// available candidates, the least load among them, and how many leading characters of the
	// text the tree holds for several workers); nil means the least loaded worker.
	placeMiss func(av []cand, minLoad int64, text string, known int) *cand
	// pickHolder, when set, chooses among the candidates holding the matched prefix (holders,
	// by id) given the least load of the pool; nil means leastLoadedHolder. It returns nil when
	// no candidate holds it.
	pickHolder func(av []cand, holders []string, minLoad int64) *cand
	// acceptHit, when set, says whether the least loaded holder of the prompt may take it given
	// the least load of the pool; when it may not, the prompt is placed as a miss.
	acceptHit func(av []cand, h *cand, minLoad int64) bool

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	budget    *TreeBudget // shared with the router's other policies; nil: none
}

var (
	_ Policy           = (*CacheAware)(nil)
	_ Forgetter        = (*CacheAware)(nil)
	_ DecisionReporter = (*CacheAware)(nil)
	_ TreeReporter     = (*CacheAware)(nil)
	_ Recorder         = (*CacheAware)(nil)
)

const (
	caHit = iota
	caMiss
	caImbalanced
)

// NewCacheAware returns a CacheAware policy built from cfg and, unless cfg.NoBackground, starts
// its eviction loop; Close stops it.
func NewCacheAware(cfg Config) *CacheAware {
	c := cfg.withDefaults()
	p := &CacheAware{
		cfg:   c.CacheAware,
		loads: c.Loads,
		tree:  radix.New(radix.Options{Now: c.Now}),
		dec:   newCounters(BranchCacheHit, BranchCacheMiss, BranchImbalanced),
		kv:    c.CacheAware.OverloadTokenUsageThreshold < 1 || c.CacheAware.BalanceTokenUsageThreshold < 1,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	p.budget = c.Budget
	p.budget.add(p.tree)
	if c.NoBackground {
		close(p.done)
		return p
	}
	go p.evictLoop(p.cfg.EvictionInterval)
	return p
}

// Name returns "cache_aware".
func (*CacheAware) Name() string { return "cache_aware" }

// evictLoop runs Evict every interval until Close.
func (p *CacheAware) evictLoop(interval time.Duration) {
	defer close(p.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.Evict()
		}
	}
}

// Evict trims every worker's share of the tree to MaxTreeSize characters, or less when the
// gateway-wide TreeBudget is exceeded, least recently used first, now. The eviction loop calls
// it; the virtual-time fleet simulator calls it itself.
func (p *CacheAware) Evict() { p.tree.Evict(p.budget.shareCap(int64(p.cfg.MaxTreeSize))) }

// Close stops the eviction loop and waits for it to exit. It is idempotent and always returns
// nil; it exists so that owners can treat policies as io.Closer.
func (p *CacheAware) Close() error {
	p.closeOnce.Do(func() { close(p.stop); p.budget.remove(p.tree) })
	<-p.done
	return nil
}

// Forget removes the worker from the tree at once.
func (p *CacheAware) Forget(workerID string) { p.tree.Remove(workerID) }

// Decisions returns decisions by branch: cache_hit, cache_miss, imbalanced.
func (p *CacheAware) Decisions() map[string]uint64 { return p.dec.snapshot() }

// TreeSizes returns worker id → characters the tree records for it.
func (p *CacheAware) TreeSizes() map[string]int64 { return p.tree.Sizes() }

// candBufs recycles Pick's candidate buffers. Pick hands its buffer to the placeMiss and
// acceptHit hooks, func values through which any buffer escapes: a buffer on the stack would be
// 1.5 KB allocated and zeroed on the heap per request.
var candBufs = sync.Pool{New: func() any { return new([64]cand) }}

// Pick gathers the available candidates, their loads and the least loaded in one pass. If the
// pool is imbalanced it returns the least loaded worker (still recording the text for it).
// Otherwise it matches the text against the tree: above CacheThreshold it returns the least
// loaded of the workers holding the matched prefix (the reference gateway takes whichever
// holder the node last remembered; taking the least loaded keeps affinity and spreads a hot
// prefix that several workers hold), else the least loaded worker. The text is recorded for the
// chosen worker in the same descent.
func (p *CacheAware) Pick(candidates []*worker.Worker, req *Request) *worker.Worker {
	buf := candBufs.Get().(*[64]cand)
	av, minI, imbalanced := p.gather(buf[:0], candidates)
	defer func() {
		clear(buf[:min(len(av), len(buf))]) // hold no worker alive from the pool
		candBufs.Put(buf)
	}()
	if len(av) == 0 {
		return nil
	}
	best := &av[minI]
	switch {
	case imbalanced:
		p.dec.add(caImbalanced)
		if req.Text == "" {
			req.decide(BranchImbalanced, 0, false)
			return best.w
		}
		p.Record(req, best.w)
		req.Decision.Branch = BranchImbalanced
		return best.w
	case req.Text == "":
		p.dec.add(caMiss)
		req.decide(BranchCacheMiss, 0, false)
		return best.w
	}
	hit := false
	predicted := 0.0
	// Every worker holding more than the threshold of the text is a candidate, not only those
	// on the deepest matched node: under load the prefix spreads to more workers, and the least
	// loaded of them keeps the hit without queueing behind the first holder.
	p.tree.RouteHolders(req.Text, p.cfg.CacheThreshold, func(m *radix.Match) string {
		if m.Ratio() > p.cfg.CacheThreshold {
			if h := p.holder(av, m.Holders, av[minI].load); h != nil && (p.acceptHit == nil || p.acceptHit(av, h, av[minI].load)) {
				best, hit = h, true
				predicted = p.predict(m, best.w.ID)
				return best.w.ID
			}
		}
		if p.placeMiss != nil {
			best = p.placeMiss(av, av[minI].load, req.Text, m.Shared)
		}
		predicted = p.predict(m, best.w.ID)
		return best.w.ID
	})
	if hit {
		p.dec.add(caHit)
		req.decide(BranchCacheHit, predicted, true)
	} else {
		p.dec.add(caMiss)
		req.decide(BranchCacheMiss, predicted, true)
	}
	return best.w
}

// holder returns the candidate a hit goes to among the holders of the matched prefix.
func (p *CacheAware) holder(av []cand, holders []string, minLoad int64) *cand {
	if p.pickHolder != nil {
		return p.pickHolder(av, holders, minLoad)
	}
	return leastLoadedHolder(av, holders)
}

// predict is the share of m's text that the tree says worker id holds: the whole match when id
// is on the deepest matched node, more than CacheThreshold (taken as the threshold, a lower
// bound) when it is only among the holders, else nothing. The tree records what was sent, not
// what the engine kept, so this is the prediction that audit compares with cached_tokens.
func (p *CacheAware) predict(m *radix.Match, id string) float64 {
	switch {
	case slices.Contains(m.Tenants, id):
		return m.Ratio()
	case slices.Contains(m.Holders, id):
		return p.cfg.CacheThreshold
	}
	return 0
}

// Record records req.Text as sent to w without choosing, and sets req.Decision's prediction
// for w (its branch is left to the caller). The sticky wrapper calls it when it, not this
// policy, chose the worker, so that the tree still learns where the conversation lives.
func (p *CacheAware) Record(req *Request, w *worker.Worker) {
	if req.Text == "" {
		req.decide("", 0, false)
		return
	}
	predicted := 0.0
	p.tree.Route(req.Text, func(m *radix.Match) string {
		predicted = p.predict(m, w.ID)
		return w.ID
	})
	req.decide("", predicted, true)
}

// gather appends the available candidates with their loads to dst and returns them, the index
// of the least loaded, and whether the pool is imbalanced.
func (p *CacheAware) gather(dst []cand, candidates []*worker.Worker) (av []cand, minI int, imbalanced bool) {
	av, minI = gatherLoads(dst, candidates, p.loads)
	if len(av) == 0 {
		return av, 0, false
	}
	var maxLoad int64
	minUse, maxUse, kvSeen := 1.0, 0.0, false
	for i := range av {
		maxLoad = max(maxLoad, av[i].load)
		if p.kv {
			if r, ok := p.loads.Report(av[i].w); ok && r.HasTokenData {
				minUse, maxUse, kvSeen = min(minUse, r.TokenUsage), max(maxUse, r.TokenUsage), true
			}
		}
	}
	minLoad := av[minI].load
	imbalanced = BalanceOf(p.cfg).Imbalanced(minLoad, maxLoad)
	if kvSeen {
		overloaded := maxUse > p.cfg.OverloadTokenUsageThreshold
		spread := maxUse-minUse > p.cfg.BalanceTokenUsageThreshold
		imbalanced = imbalanced || overloaded || spread
	}
	return av, minI, imbalanced
}

// idSeed seeds the hash of the candidate table in leastLoadedHolder; the table lives for one
// call, so a per-process seed is fine (unlike the hashing policies, which must agree across
// replicas).
var idSeed = maphash.MakeSeed()

// leastLoadedHolder returns the least loaded candidate whose id is among tenants, or nil.
func leastLoadedHolder(av []cand, tenants []string) *cand {
	var best *cand
	eachHolder(av, tenants, func(i int) {
		if best == nil || lessLoaded(&av[i], best) {
			best = &av[i]
		}
	})
	return best
}

// eachHolder calls consider with the index in av of every candidate whose id is among tenants. A popular prefix can
// be held by most of a large pool, so instead of comparing every candidate with every tenant it
// indexes the candidates by id hash in a small table on the stack.
func eachHolder(av []cand, tenants []string, consider func(i int)) {
	if len(av)*len(tenants) <= 64 || len(av) > 127 {
		for i := range av {
			if slices.Contains(tenants, av[i].w.ID) {
				consider(i)
			}
		}
		return
	}
	var tab [256]uint8 // av index + 1; 0 is empty. At most half full.
	const mask = uint64(len(tab) - 1)
	for i := range av {
		h := maphash.String(idSeed, av[i].w.ID) & mask
		for tab[h] != 0 {
			h = (h + 1) & mask
		}
		tab[h] = uint8(i + 1)
	}
	for _, name := range tenants {
		for h := maphash.String(idSeed, name) & mask; tab[h] != 0; h = (h + 1) & mask {
			if i := int(tab[h]) - 1; av[i].w.ID == name {
				consider(i)
				break
			}
		}
	}
}
