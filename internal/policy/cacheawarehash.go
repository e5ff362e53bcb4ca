package policy

// placementChars is how many leading characters of the routing text choose the worker for a
// prefix that no tree holds. Short enough to lie inside a typical system prompt or tenant
// context (so that every request sharing it hashes alike, whatever its tail), long enough to
// tell different ones apart; the bounded load keeps a boilerplate opening shared by unrelated
// prompts from piling onto one worker.
const placementChars = 256

// CacheAwareHash is cache_aware with coordination-free placement (DESIGN.md §1, "Many gateways,
// one fleet"). It routes exactly as cache_aware does — affinity to the least loaded worker
// holding more than CacheThreshold of the prompt, the least loaded worker when the pool is
// imbalanced — except on a miss: a prompt that this replica's tree does not hold goes to the
// first worker in rendezvous-hash order of its first 256 characters that is within cache_aware's
// balance thresholds of the least loaded (consistent hashing with bounded loads, the bound being
// the one cache_aware already applies to hits), instead of the least loaded one.
//
// Why: with several gateway replicas each tree sees only the requests that reached its replica,
// so under cache_aware the first request of a prefix at each replica is a miss that lands on
// whichever worker that replica finds least loaded, and the prefix ends up cached on as many
// workers as there are replicas. The hash gives every replica the same first choice for the same
// prefix, so their trees converge on the worker that already holds it, with no shared state.
// Create it with NewCacheAwareHash; the zero value is not usable.
type CacheAwareHash struct {
	*CacheAware
}

var (
	_ Policy           = (*CacheAwareHash)(nil)
	_ Forgetter        = (*CacheAwareHash)(nil)
	_ DecisionReporter = (*CacheAwareHash)(nil)
	_ TreeReporter     = (*CacheAwareHash)(nil)
)

// NewCacheAwareHash returns a CacheAwareHash built from cfg; like NewCacheAware it starts the
// eviction loop unless cfg.NoBackground, and Close stops it.
func NewCacheAwareHash(cfg Config) *CacheAwareHash {
	p := &CacheAwareHash{CacheAware: NewCacheAware(cfg)}
	p.placeMiss = func(av []cand, minLoad int64, text string) *cand {
		return p.place(av, minLoad, hashString(prefixChars(text, placementChars)))
	}
	return p
}

// Name returns "cache_aware_hash".
func (*CacheAwareHash) Name() string { return "cache_aware_hash" }

// place returns the candidate with the highest rendezvous score for key among those that would
// not make the pool imbalanced by cache_aware's own rule (load more than BalanceAbsThreshold
// above the minimum and more than BalanceRelThreshold times it): a new prefix is treated as if its
// hash owner already held it, and affinity wins exactly as far as it would on a hit. The least
// loaded candidate always qualifies, so some candidate is returned.
func (p *CacheAwareHash) place(av []cand, minLoad int64, key uint64) *cand {
	var best *cand
	var bestScore uint64
	b := BalanceOf(p.cfg)
	for i := range av {
		c := &av[i]
		if !b.Within(c.load, minLoad) {
			continue
		}
		if s := score(key, c.w.ID); best == nil || s > bestScore {
			best, bestScore = c, s
		}
	}
	return best
}
