package policy

import "math"

// placementChars is how many leading characters of the routing text choose the worker for a
// prefix that no tree holds. Short enough to lie inside a typical system prompt or tenant
// context (so that every request sharing it hashes alike, whatever its tail), long enough to
// tell different ones apart; the bounded load keeps a boilerplate opening shared by unrelated
// prompts from piling onto one worker.
const placementChars = 256

// knownGrain is the granularity to which the length of the known part of a prompt is rounded
// down before the placement key is cut after it: replicas whose trees match a shared opening to
// within a few characters (a chance match of a word or two past it) still cut the same key.
const knownGrain = 64

// placementKey returns the text whose hash places a prompt that no worker holds enough of: its
// first placementChars characters past the part the tree already knows (rounded down to
// knownGrain). Hashing only the opening would send every prompt that opens alike — every
// request of an application starts with its system prompt — to one worker; the characters past
// the known opening are what tells them apart, and every replica that knows the opening cuts the
// same key, so the replicas still agree.
func placementKey(text string, known int) string {
	return prefixChars(text, known/knownGrain*knownGrain+placementChars)
}

// placeSlack and placeSlackQueued bound the load of the worker that takes a new prompt by its
// hash: at most mean + slack·√mean requests, the mean counting the request being placed (and
// never less than one above the least load). √mean is the noise of a count of random arrivals,
// so the bound tolerates noise at small loads (where replicas must keep agreeing on owners) and
// tightens to a few percent of the load at large ones. When some engine queues (its batch or KV
// cache is full: capacity-relative saturation, 8 running slots or 256) balance matters more than
// agreement, and the tighter slack applies. Measured (docs/routing.md, "The default policy"):
// slack 1 always lost new conversations between replicas (Mooncake twin at 8 gateways, hit 0.233
// against 0.269), slack 3 always let a saturated 4 × 8-slot fleet queue unevenly (multi-turn TTFT
// p99 14.0 s against 11.2 s); the bound of the previous default (64 requests above the least)
// let prefill queues grow behind a common opening until the spread reached 48.
const (
	placeSlack       = 3
	placeSlackQueued = 1
)

// keepHitChars is the matched prefix, in characters of the routing text, from which
// cache_aware_hash keeps a hit while the pool is imbalanced (CacheAware.keepHitChars): 2,048
// characters, about 512 tokens, 64 ms of prefill at the simulator's 8,000 tokens/s. cache_aware's
// imbalanced branch sends every request to the least loaded worker; for a long cached context
// that is a miss of thousands of tokens on the least loaded engine, whose prefill then delays
// everything behind it. Measured on long-context (docs/routing.md §8.4): at 34 req/s the
// imbalanced branch took 706 requests, most of them 6,000-token misses, and TTFT p99 was 21.5 s
// (hit 0.954); keeping the hits on holders within the balance rule gives 14.1 ms (hit 0.996), and
// goodput under a 2 s SLO rises from 31.5 to 39.5 req/s. Short matches (a hot system prompt that
// every engine holds anyway) keep going to the least loaded worker: keeping those too made
// shared-prefix at 8 gateways worse (TTFT p99 270 → 303 ms).
const keepHitChars = 2048

// CacheAwareHash is cache_aware with coordination-free placement (DESIGN.md §1, "Many gateways,
// one fleet"), the default policy. It routes as cache_aware does — affinity to the least loaded
// worker holding more than CacheThreshold of the prompt, the least loaded worker when the pool
// is imbalanced — with two differences:
//
//   - A prompt that this replica's tree does not hold goes to the first worker in the rendezvous
//     order of its placement key (placementKey: the first 256 characters past the opening that
//     several workers already hold) whose load is within cache_aware's balance thresholds of the
//     least loaded and below mean + slack·√mean (consistent hashing with bounded loads; see
//     placeSlack), instead of the least loaded one.
//   - The slack tightens while any engine queues (reports waiting requests): an engine queues
//     only once its batch or its KV cache is full, so this judges saturation against each
//     engine's own capacity, where the request-count thresholds assume large batches.
//   - On a decode-bound, uniform fleet a hit goes round the holders below the bound instead of
//     to the least loaded one, and behind one gateway a new prompt goes to the least recently
//     picked worker within the bounds (cacheawarerotate.go): least loaded herds arrivals into
//     cohorts whose prefills stall whole batches.
//   - On a decode-bound fleet behind several gateways a new prompt passes over a worker that is
//     still prefilling a request of this replica (no first byte yet), unless the engines report
//     much more cached than this replica predicted (cacheawarefirst.go).
//   - While the pool is imbalanced, a match of at least keepHitChars characters keeps its hit on
//     a holder within the balance rule instead of becoming a miss on the least loaded worker.
//   - Behind one gateway, on a uniform fleet that queues but is neither prefill- nor
//     decode-bound, a new prompt goes to the least loaded worker within the bounds
//     (cacheawarequeue.go).
//   - Behind one gateway, on a fleet whose engines prefill at measured rates a factor of two or
//     more apart, a new prompt's rendezvous order is weighted by speed and the prefill backlog
//     is judged as expected wait (cacheawarespeed.go).
//
// Why the hash: with several gateway replicas each tree sees only the requests that reached its
// replica, so under cache_aware the first request of a prefix at each replica is a miss that
// lands on whichever worker that replica finds least loaded, and the prefix ends up cached on as
// many workers as there are replicas. The hash gives every replica the same first choice for the
// same prefix, so their trees converge on the worker that already holds it, with no shared
// state. Why past the shared opening: when every prompt starts with the same system prompt,
// hashing the opening sends every new prompt to the same worker (measured: load spread 48 and
// TTFT p99 46 s on the Mooncake-format twin). Create it with NewCacheAwareHash; the zero value
// is not usable.
type CacheAwareHash struct {
	*CacheAware
	sent   sentTokens  // uncached tokens sent per worker since its poll (cacheawarewait.go)
	recent picks       // this replica's last pick of each worker (cacheawarerotate.go)
	unpred unpredicted // cached share the engines reported beyond the prediction (cacheawarefirst.go)
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
	p.placeMiss = func(av []cand, minLoad int64, text string, known int) *cand {
		return p.place(av, minLoad, hashString(placementKey(text, known)), true)
	}
	p.pickHolder = p.rotateHolders
	p.keepHitChars = keepHitChars
	return p
}

// Name returns "cache_aware_hash".
func (*CacheAwareHash) Name() string { return "cache_aware_hash" }

// anyQueued reports whether some candidate's last fresh report shows waiting requests: its
// engine's batch or KV cache is full.
func (p *CacheAwareHash) anyQueued(av []cand) bool {
	for i := range av {
		if r, ok := p.loads.Report(av[i].w); ok && r.Waiting > 0 {
			return true
		}
	}
	return false
}

// bound returns the load below which a candidate may take a new prompt (or, on a hit, join the
// rotation among the holders): max(⌈mean + slack·√mean⌉, minLoad + 1), the mean counting the
// request being placed, slack placeSlack or, while any candidate's engine queues,
// placeSlackQueued.
func (p *CacheAwareHash) bound(av []cand, minLoad int64) int64 {
	var total int64
	for i := range av {
		total += av[i].load
	}
	mean := float64(total+1) / float64(len(av))
	slack := float64(placeSlack)
	if p.anyQueued(av) {
		slack = placeSlackQueued
	}
	return max(int64(math.Ceil(mean+slack*math.Sqrt(mean))), minLoad+1)
}

// place returns the candidate with the highest rendezvous score for key among those that may
// take a new prompt: within cache_aware's balance rule of the least loaded (Balance.Within) and
// below max(⌈mean + slack·√mean⌉, least load + 1). The least loaded candidate always passes both,
// so some candidate is returned; the fallback to it is only a guard.
func (p *CacheAwareHash) place(av []cand, minLoad int64, key uint64, byBacklog bool) *cand {
	var best *cand
	var bestScore uint64
	b := BalanceOf(p.cfg)
	bound := p.bound(av, minLoad)
	var least *cand
	var buf, wbuf [64]float64
	tok, weight := buf[:0], wbuf[:0]
	if len(av) > len(buf) {
		tok, weight = make([]float64, len(av)), make([]float64, len(av))
	}
	tok, weight = tok[:len(av)], weight[:len(av)]
	leastTok, prefillBound, rotate, mixed, passPrefilling := 0.0, false, false, false, false
	if byBacklog {
		mixed = p.weights(av, weight)
		if !mixed {
			weight = nil
		}
		leastTok, prefillBound = p.backlogs(av, tok, weight)
		if !prefillBound && p.decodeBound(av) {
			rotate = p.solo(av)
			passPrefilling = !rotate && !p.othersPlace()
		}
	}
	leastFirst := byBacklog && !rotate && !prefillBound && !mixed && p.leastOnQueue(av)
	var bestW float64   // the best weighted score, on a mixed fleet
	var bestLast uint64 // the best candidate's last pick, in the rotation
	var fallback *cand  // the best candidate when every one within the bounds is prefilling
	var fallbackScore uint64
	for i := range av {
		c := &av[i]
		if least == nil || lessLoaded(c, least) {
			least = c
		}
		if !b.Within(c.load, minLoad) || c.load >= bound {
			continue
		}
		if prefillBound && tok[i] > leastTok+spillTokens {
			continue
		}
		if rotate {
			if l := p.recent.lastOf(c.w.ID); best == nil || staler(c, l, best, bestLast) {
				best, bestLast = c, l
			}
			continue
		}
		s := score(key, c.w.ID)
		if passPrefilling && prefilling(c) {
			if fallback == nil || s > fallbackScore {
				fallback, fallbackScore = c, s
			}
			continue
		}
		if leastFirst {
			if best == nil || lessLoaded(c, best) {
				best = c
			}
			continue
		}
		if mixed {
			if ws := weightedScore(s, weight[i]); best == nil || ws > bestW {
				best, bestW = c, ws
			}
			continue
		}
		if best == nil || s > bestScore {
			best, bestScore = c, s
		}
	}
	switch {
	case best != nil:
		return best
	case fallback != nil:
		return fallback
	}
	return least
}
