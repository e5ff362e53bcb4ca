package policy

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

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
// unless the pool is imbalanced: the classic SGLang rule. It keeps one prefix
// tree (one policy serves one model) and, unless Config.NoBackground, one goroutine that trims
// the tree every EvictionInterval until Close. Create it with NewCacheAware; the zero value is not
// usable.
type CacheAware struct {
	*prefixTree
	cfg   CacheAwareConfig
	loads Loads
	dec   *counters
	kv    bool // a KV-usage trigger is on
}

var (
	_ Policy           = (*CacheAware)(nil)
	_ Forgetter        = (*CacheAware)(nil)
	_ DecisionReporter = (*CacheAware)(nil)
	_ TreeReporter     = (*CacheAware)(nil)
	_ Recorder         = (*CacheAware)(nil)
	_ Opener           = (*CacheAware)(nil)
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
	return &CacheAware{
		prefixTree: newPrefixTree(c),
		cfg:        c.CacheAware,
		loads:      c.Loads,
		dec:        newCounters(BranchCacheHit, BranchCacheMiss, BranchImbalanced),
		kv:         c.CacheAware.OverloadTokenUsageThreshold < 1 || c.CacheAware.BalanceTokenUsageThreshold < 1,
	}
}

// Name returns "cache_aware".
func (*CacheAware) Name() string { return "cache_aware" }

// Forget removes the worker from the tree at once.
func (p *CacheAware) Forget(workerID string) { p.tree.Remove(workerID) }

// Decisions returns decisions by branch: cache_hit, cache_miss, imbalanced.
func (p *CacheAware) Decisions() map[string]uint64 { return p.dec.snapshot() }

// candBufs recycles Pick's candidate buffers.
var candBufs = sync.Pool{New: func() any { return new([64]cand) }}

// Pick gathers the available candidates, their loads and the least loaded in one pass. If the
// pool is imbalanced it returns the least loaded worker (still recording the text for it).
// Otherwise it matches the text against the tree: above CacheThreshold it returns the least
// loaded of the workers holding the matched prefix (the reference gateway takes whichever
// holder the node last remembered; taking the least loaded keeps affinity and spreads a hot
// prefix that several workers hold), else the least loaded worker. The text is recorded for the
// chosen worker in the same descent.
func (p *CacheAware) Pick(_ context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
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
			if h := leastLoadedHolder(av, m.Holders); h != nil {
				best, hit = h, true
			}
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

// Balance is cache_aware's request-count balance rule: the pool is imbalanced
// when the most loaded worker has more than Abs requests above the least loaded and more than Rel
// times its load. The sticky wrapper's saturation rule uses it too.
type Balance struct {
	// Abs is balance_abs_threshold; Rel is balance_rel_threshold.
	Abs int64
	Rel float64
}

// BalanceOf returns the balance rule of cfg.
func BalanceOf(cfg CacheAwareConfig) Balance {
	return Balance{Abs: cfg.BalanceAbsThreshold, Rel: cfg.BalanceRelThreshold}
}

// Imbalanced reports whether loads minLoad and maxLoad, the least and the most of a pool, make
// it imbalanced.
func (b Balance) Imbalanced(minLoad, maxLoad int64) bool {
	return maxLoad-minLoad > b.Abs && float64(maxLoad) > b.Rel*float64(minLoad)
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
