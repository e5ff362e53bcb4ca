package policy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// KVView is what precise routing needs from the engines' KV-cache events (package kvevents
// implements it): the request's tokens as the engines count them, and how many leading tokens
// each worker's engine really holds.
type KVView interface {
	// Tokenize returns the token ids of a request for model (a chat request's messages from its
	// body, else text), asking worker via when it must; it fails when it cannot in time.
	Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error)
	// Covers reports whether Match can answer for every worker (checked before tokenizing).
	Covers(model string, workers []string) bool
	// Match writes to out[i] the leading tokens of toks that workers[i]'s engine holds for
	// model; it reports false when the events cannot answer for every worker.
	Match(model string, toks []uint32, workers []string, out []int) bool
}

// Precise-prefix branches, as reported by Decisions beside cache_aware's own.
const (
	// BranchPreciseHit: the request went to a worker whose engine holds more than
	// CacheThreshold of its prompt, by the engines' own events.
	BranchPreciseHit = "precise_hit"
	// BranchPreciseMiss: no engine holds enough; the prompt was placed by hash.
	BranchPreciseMiss = "precise_miss"
	// BranchFallbackNoEvents: the events could not answer for every candidate (no stream yet,
	// a resync after a gap, events off), so the prefix tree decided.
	BranchFallbackNoEvents = "fallback_no_events"
	// BranchFallbackTokenizer: tokenization failed or missed its deadline; the tree decided.
	BranchFallbackTokenizer = "fallback_tokenizer"
)

const (
	prHit = iota
	prMiss
	prNoEvents
	prTokenizer
)

// PrecisePrefix routes on what the engines report they hold (DESIGN.md §8): it tokenizes the
// request as the engines do, finds the longest prefix each candidate's engine really holds, and
// applies cache_aware's load rules to that — affinity to the least loaded worker holding more
// than CacheThreshold of the prompt, the least loaded worker when the pool is imbalanced, and
// cache_aware_hash's bounded-load placement on a miss, keyed by the tokens past the opening that
// several engines hold. When the events or the tokenizer cannot answer in time
// it routes exactly as cache_aware_hash (whose prefix tree it keeps up to date on every pick), and
// Decisions says how often.
//
// Why: the prefix tree records what this replica sent, not what engines kept. An engine that
// evicted a prefix still looks like its holder; what another replica sent is invisible. Events
// fix both, so several replicas that each subscribe to every engine agree without talking.
// Create it with NewPrecisePrefix; the zero value is not usable.
type PrecisePrefix struct {
	*CacheAwareHash
	kv  KVView
	dec *counters
	// decideNS sums the time spent in precise decisions (tokenization and matching included);
	// decided counts them.
	decideNS, decided atomic.Int64
}

var (
	_ Policy           = (*PrecisePrefix)(nil)
	_ Forgetter        = (*PrecisePrefix)(nil)
	_ DecisionReporter = (*PrecisePrefix)(nil)
	_ TreeReporter     = (*PrecisePrefix)(nil)
)

// NewPrecisePrefix returns a PrecisePrefix reading cfg.KV (nil: it always falls back) with
// cache_aware_hash built from cfg as its fallback.
func NewPrecisePrefix(cfg Config) *PrecisePrefix {
	return &PrecisePrefix{
		CacheAwareHash: NewCacheAwareHash(cfg),
		kv:             cfg.KV,
		dec:            newCounters(BranchPreciseHit, BranchPreciseMiss, BranchFallbackNoEvents, BranchFallbackTokenizer),
	}
}

// Name returns "precise_prefix".
func (*PrecisePrefix) Name() string { return "precise_prefix" }

// Decisions returns the precise branches and the fallback's (cache_hit, cache_miss,
// imbalanced: those taken by the prefix tree or, for imbalanced, by the load rule).
func (p *PrecisePrefix) Decisions() map[string]uint64 {
	out := p.CacheAwareHash.Decisions()
	for k, v := range p.dec.snapshot() {
		out[k] = v
	}
	return out
}

// DecisionTime returns the number of precise decisions and the mean time one took, tokenization
// and matching included (fallbacks excluded).
func (p *PrecisePrefix) DecisionTime() (n int64, mean time.Duration) {
	n = p.decided.Load()
	if n == 0 {
		return 0, 0
	}
	return n, time.Duration(p.decideNS.Load() / n)
}

// cache_aware_hash's placement key (placementKey) in tokens, the unit of events and tokenization,
// at about 4 characters a token.
const (
	placementTokens  = placementChars / 4
	knownGrainTokens = knownGrain / 4
)

// tokenPlacementKey hashes the first placementTokens tokens past the opening that at least two
// engines hold (out: the tokens each candidate's engine holds), rounded down to
// knownGrainTokens, as cache_aware_hash does in characters with its tree: prompts that share only
// a common opening (a system prompt) spread by what follows it, and every replica, seeing the
// same events, cuts the same key.
func tokenPlacementKey(toks []uint32, out []int) uint64 {
	first, second := 0, 0
	for _, n := range out {
		if n > first {
			first, second = n, first
		} else if n > second {
			second = n
		}
	}
	end := min(len(toks), second/knownGrainTokens*knownGrainTokens+placementTokens)
	const m = 0x9e3779b97f4a7c15
	h := uint64(end) * m
	for _, t := range toks[:end] {
		h = (h ^ uint64(t)) * m
		h ^= h >> 32
	}
	return h
}

// Pick chooses the worker; see the type's doc.
func (p *PrecisePrefix) Pick(candidates []*worker.Worker, req *Request) *worker.Worker {
	if p.kv == nil || req.Text == "" && !req.Chat {
		p.dec.add(prNoEvents)
		return p.CacheAwareHash.Pick(candidates, req)
	}
	var buf [64]cand
	av, minI, imbalanced := p.gather(buf[:0], candidates)
	if len(av) == 0 {
		return nil
	}
	if imbalanced {
		return p.CacheAwareHash.Pick(candidates, req)
	}
	start := time.Now()
	var idBuf [64]string
	var outBuf [64]int
	ids, out := idBuf[:0], outBuf[:0]
	for i := range av {
		ids = append(ids, av[i].w.ID)
		out = append(out, 0)
	}
	if !p.kv.Covers(req.Model, ids) {
		p.dec.add(prNoEvents)
		return p.CacheAwareHash.Pick(candidates, req)
	}
	toks, err := p.kv.Tokenize(context.Background(), av[minI].w, req.Model, req.Chat, req.Body, req.Text)
	if err != nil || len(toks) == 0 {
		p.dec.add(prTokenizer)
		return p.CacheAwareHash.Pick(candidates, req)
	}
	if !p.kv.Match(req.Model, toks, ids, out) {
		p.dec.add(prNoEvents)
		return p.CacheAwareHash.Pick(candidates, req)
	}
	best, held := (*cand)(nil), 0
	for i := range av {
		if float64(out[i])/float64(len(toks)) > p.cfg.CacheThreshold && (best == nil || lessLoaded(&av[i], best)) {
			best, held = &av[i], out[i]
		}
	}
	if best != nil {
		p.dec.add(prHit)
		req.decide(BranchPreciseHit, float64(held)/float64(len(toks)), true)
	} else {
		p.dec.add(prMiss)
		best = p.place(av, av[minI].load, tokenPlacementKey(toks, out), false)
		for i := range av {
			if &av[i] == best {
				held = out[i]
			}
		}
		req.decide(BranchPreciseMiss, float64(held)/float64(len(toks)), true)
	}
	// A chat request's whole messages were tokenized; other prompts only their routing text.
	req.Decision.WholePrompt = req.Chat
	p.decideNS.Add(int64(time.Since(start)))
	p.decided.Add(1)
	if req.Text != "" {
		// Keep the fallback's tree as warm as cache_aware_hash would have it.
		p.tree.Insert(req.Text, best.w.ID)
	}
	return best.w
}
