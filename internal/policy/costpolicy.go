package policy

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/radix"
	"github.com/kvgate/kvgate/internal/worker"
)

// Coster is implemented by the cost-based policies: BestCost returns the predicted time to
// first token, in seconds, on the candidate a pick would choose for req now (Terms.TTFT of the
// least cost), ok false when none is available. It has no side effects (it records nothing, sends nothing), so flow control may
// ask it before deciding whether to admit a request.
type Coster interface {
	BestCost(ctx context.Context, candidates []*worker.Worker, req *Request) (seconds float64, ok bool)
}

// KVView is what precise routing needs from the engines' KV-cache events (package kvevents
// implements it): the request's tokens as the engines count them, and how many leading tokens
// each worker's engine really holds.
type KVView interface {
	// Tokenize returns the token ids of a request for model (a chat request's messages from its
	// body, else text), asking worker via when it must; it fails when it cannot in time or ctx
	// ends.
	Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error)
	// Covers reports whether Match can answer for every worker (checked before tokenizing).
	Covers(model string, workers []string) bool
	// Match writes to out[i] the leading tokens of toks that workers[i]'s engine holds for
	// model; it reports false when the events cannot answer for every worker.
	Match(model string, toks []uint32, workers []string, out []int) bool
}

// Branches of the cost-based policies, as reported by Decisions.
const (
	// BranchSpill: some candidate was predicted to hold more of the prompt than the one chosen,
	// whose queue made it the faster choice anyway.
	BranchSpill = "spill"
	// BranchPreciseHit: precise_prefix chose the worker whose engine holds the most of the prompt,
	// by the engines' own events.
	BranchPreciseHit = "precise_hit"
	// BranchPreciseMiss: precise_prefix chose a worker holding less of the prompt than another
	// (a spill), or no engine held any of it.
	BranchPreciseMiss = "precise_miss"
	// BranchFallbackNoEvents: the events could not answer for every candidate (no stream yet,
	// a resync after a gap, events off), so the prefix tree gave Ĉ.
	BranchFallbackNoEvents = "fallback_no_events"
	// BranchFallbackTokenizer: tokenization failed or missed its deadline, or the request was
	// not prepared (Prepare); the tree gave Ĉ.
	BranchFallbackTokenizer = "fallback_tokenizer"
)

// source is where a cost policy takes Ĉ from.
type source uint8

const (
	fromNothing source = iota // least_load: Ĉ = 0
	fromTree                  // cache_aware_hash: this replica's prefix tree
	fromEvents                // precise_prefix: the engines' KV events, else the tree
)

const (
	coHit = iota
	coMiss
	coSpill
	coPreciseHit
	coPreciseMiss
	coNoEvents
	coTokenizer
)

// Cost is a cost-based policy (cost.go): least_load (Ĉ = 0), cache_aware_hash, the default (Ĉ
// from this replica's prefix tree), or precise_prefix (Ĉ from the engines' KV-cache events, the
// tree when they cannot answer). Create it with NewLeastLoad, NewCacheAwareHash or
// NewPrecisePrefix; the zero value is not usable.
type Cost struct {
	*prefixTree // nil for least_load
	name        string
	src         source
	sc          *scorer
	kv          KVView
	dec         *counters
	unpred      unpredicted
	// follow is the learned F, calib each worker's prediction error (learn.go).
	follow follower
	calib  calibration
	// capacity is each worker's learned cache capacity (learncap.go), tails the tail's
	// predictors and tailCap how long a worker keeps a tail (learntail.go).
	capacity, tailCap capacities
	tails             tails
	owners            owners // learnowner.go
	// drift checks precise_prefix's events against the answers (precisedrift.go).
	drift drifts
	// decideNS sums the time precise decisions took matching the events (tokenization is
	// Prepare's); decided counts them.
	decideNS, decided atomic.Int64
	// filtered counts the candidates each filter reason dropped, over committed decisions.
	filtered [NumFilters]atomic.Uint64
}

// countFiltered adds a committed decision's filtered candidates to the policy's counts.
func (p *Cost) countFiltered(d *Decision) {
	for i, n := range d.Filtered {
		if n > 0 {
			p.filtered[i].Add(uint64(n))
		}
	}
}

// Filtered returns how many candidates each filter reason (FilterNames) dropped over the
// policy's decisions.
func (p *Cost) Filtered() map[string]uint64 {
	m := make(map[string]uint64, NumFilters)
	for i := range p.filtered {
		m[FilterNames[i]] = p.filtered[i].Load()
	}
	return m
}

var (
	_ Policy           = (*Cost)(nil)
	_ Coster           = (*Cost)(nil)
	_ Forgetter        = (*Cost)(nil)
	_ DecisionReporter = (*Cost)(nil)
	_ Recorder         = (*Cost)(nil)
	_ Opener           = (*Cost)(nil)
	_ CacheObserver    = (*Cost)(nil)
	_ AnswerLearner    = (*Cost)(nil)
	_ Calibrator       = (*Cost)(nil)
	_ CapacityReporter = (*Cost)(nil)
	_ RateReporter     = (*Cost)(nil)
	_ DriftReporter    = (*Cost)(nil)
)

func newCost(name string, src source, cfg Config) *Cost {
	c := cfg.withDefaults()
	p := &Cost{name: name, src: src, sc: newScorer(c.Cost, c.Loads, c.Now), kv: c.KV,
		dec: newCounters(BranchCacheHit, BranchCacheMiss, BranchSpill)}
	p.sc.peers = c.Peers
	if src != fromNothing {
		p.prefixTree = newPrefixTree(c)
	}
	if src == fromEvents {
		p.dec = newCounters(BranchCacheHit, BranchCacheMiss, BranchSpill, BranchPreciseHit, BranchPreciseMiss,
			BranchFallbackNoEvents, BranchFallbackTokenizer)
	}
	return p
}

// NewLeastLoad returns least_load: the cost with Ĉ = 0, the least expected wait.
func NewLeastLoad(cfg Config) *Cost { return newCost("least_load", fromNothing, cfg) }

// NewCacheAwareHash returns cache_aware_hash, the default policy: the cost with Ĉ from this
// replica's prefix tree. Unless cfg.NoBackground it starts the tree's eviction loop; Close stops
// it.
func NewCacheAwareHash(cfg Config) *Cost { return newCost("cache_aware_hash", fromTree, cfg) }

// NewPrecisePrefix returns precise_prefix: the cost with Ĉ from the engines' KV-cache events
// (cfg.KV; nil: always the tree's). It keeps the tree up to date on every pick, for the requests
// the events cannot answer.
func NewPrecisePrefix(cfg Config) *Cost { return newCost("precise_prefix", fromEvents, cfg) }

// Name returns the policy's canonical name.
func (p *Cost) Name() string { return p.name }

// Forget drops everything the policy holds for the worker.
func (p *Cost) Forget(workerID string) {
	if p.prefixTree != nil {
		p.tree.Remove(workerID)
	}
	p.sc.forget(workerID)
	p.calib.forget(workerID)
	p.capacity.forget(workerID)
	p.tailCap.forget(workerID)
	p.drift.forget(workerID)
}

// Close stops the tree's eviction loop, if there is one.
func (p *Cost) Close() error {
	if p.prefixTree != nil {
		return p.prefixTree.Close()
	}
	return nil
}

// Evict trims the tree, if there is one.
func (p *Cost) Evict() {
	if p.prefixTree != nil {
		p.prefixTree.Evict()
	}
}

// TreeSizes returns the tree's sizes; nil for least_load.
func (p *Cost) TreeSizes() map[string]int64 {
	if p.prefixTree == nil {
		return nil
	}
	return p.prefixTree.TreeSizes()
}

// HotPrefixes returns the tree's hot prefixes; nil for least_load.
func (p *Cost) HotPrefixes(opts radix.HotOptions) []radix.HotPrefix {
	if p.prefixTree == nil {
		return nil
	}
	return p.prefixTree.HotPrefixes(opts)
}

// RecordWarm records text for workerID in the tree, if there is one.
func (p *Cost) RecordWarm(workerID, text string) {
	if p.prefixTree != nil {
		p.prefixTree.RecordWarm(workerID, text)
	}
}

// Decisions returns decisions by branch: cache_hit (the chosen worker holds the longest
// predicted prefix, and some), cache_miss (nobody holds any), spill, and for precise_prefix its
// own branches.
func (p *Cost) Decisions() map[string]uint64 { return p.dec.snapshot() }

// DecisionTime returns the number of decisions precise_prefix took on events and the mean time
// one took matching them (fallbacks excluded; tokenization is Prepare's).
func (p *Cost) DecisionTime() (n int64, mean time.Duration) {
	n = p.decided.Load()
	if n == 0 {
		return 0, 0
	}
	return n, time.Duration(p.decideNS.Load() / n)
}

// Pick runs the pipeline of cost.go and returns the worker of least expected time to first
// token; req.Decision records its terms and the runner-up's.
func (p *Cost) Pick(ctx context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
	return p.decide(ctx, candidates, req, true)
}

// BestCost returns the expected time to first token on the candidate a pick would choose,
// without recording anything (Coster).
func (p *Cost) BestCost(ctx context.Context, candidates []*worker.Worker, req *Request) (float64, bool) {
	var scratch Request
	if req != nil {
		scratch = *req
	}
	w := p.decide(ctx, candidates, &scratch, false)
	if w == nil {
		return 0, false
	}
	return scratch.Decision.Chosen.TTFT(), true
}

// Record records that req goes to w although this policy did not choose it (the sticky
// wrapper chose): the tree learns the text, the tokens count as sent to w, and req.Decision gets
// w's predicted share.
func (p *Cost) Record(req *Request, w *worker.Worker) {
	buf := getCands(1)
	av := *buf
	defer func() { putCands(buf, av) }()
	av = p.sc.gather(av, []*worker.Worker{w}, p.sc.promptTokens(req), req, false, false)
	if len(av) == 0 {
		req.decide("", 0, false)
		return
	}
	c := &av[0]
	if p.prefixTree != nil && req.Text != "" {
		p.tree.Route(req.Text, func(m *radix.Match) string {
			for _, t := range m.Tenants {
				if t == w.ID {
					c.t.Cached = p.sc.est.Tokens(int64(m.Chars))
				}
			}
			return w.ID
		})
	}
	c.t.Cached = min(c.t.Cached, c.t.Prompt)
	c.t.price()
	req.decide("", 0, false)
	record(req, av, 0, -1)
	if p.prefixTree != nil && c.t.Prompt > 0 {
		req.Decision.Predicted, req.Decision.HasPrediction, req.Decision.WholePrompt = c.t.Cached/c.t.Prompt, true, true
	}
	p.sc.commit(c, c.t.Prompt-c.t.Cached)
	if p.sc.peers != nil {
		peerDecided(p.sc.peers, req, w.ID, c.t.Prompt-c.t.Cached)
	}
}

// unpredicted is a moving average of the share of the prompt that the engines reported cached
// beyond what this replica predicted: how far the tree's picture is off (other replicas placing
// the conversations this one sees, engines evicting).
type unpredicted struct {
	mu  sync.Mutex
	avg float64
	n   int // answers averaged, up to unpredictedWindow
}

// unpredictedWindow is the number of answers the unpredicted share is averaged over.
const unpredictedWindow = 256

// Observed records one answered request (CacheObserver): predicted is the share of the prompt
// this replica predicted cached, reported the share the engine reported. Values outside [0,1]
// (a worker's bogus usage) are clamped. It informs Unpredicted only; routing does not read it.
func (p *Cost) Observed(predicted, reported float64) {
	d := clamp01(reported) - clamp01(predicted)
	u := &p.unpred
	u.mu.Lock()
	defer u.mu.Unlock()
	// A mean over the answers so far until there are unpredictedWindow of them, a moving
	// average after: the first answers count at once.
	u.n = min(u.n+1, unpredictedWindow)
	u.avg += (d - u.avg) / float64(u.n)
}

// Unpredicted returns the moving average of reported − predicted cached share (Observed).
func (p *Cost) Unpredicted() float64 {
	u := &p.unpred
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.avg
}

func clamp01(x float64) float64 {
	if !(x > 0) { // NaN too
		return 0
	}
	return min(x, 1)
}

// placementChars is how many leading characters of the routing text past the opening that the
// tree already holds for several workers make the placement key of a prompt: short enough to lie
// inside a typical system prompt or tenant context (so every request sharing it hashes alike,
// whatever its tail), long enough to tell different ones apart.
const placementChars = 256

// knownGrain is the granularity to which the known opening is rounded down before the key is cut
// after it: replicas whose trees match a shared opening to within a few characters still cut the
// same key.
const knownGrain = 64

// placementKey returns the text whose hash orders the tied candidates of a prompt: its first
// placementChars characters past the part several workers already hold (rounded down to
// knownGrain). Hashing only the opening would tie every prompt of an application (they all start
// with its system prompt) to one order; the characters past it tell them apart, and every replica
// that knows the opening cuts the same key.
func placementKey(text string, known int) string {
	return prefixChars(text, known/knownGrain*knownGrain+placementChars)
}

// placementKey in tokens, at about 4 characters a token.
const (
	placementTokens  = placementChars / 4
	knownGrainTokens = knownGrain / 4
)

// tokenPlacementKey hashes the first placementTokens tokens past the opening that at least two
// engines hold (out: the tokens each candidate's engine holds), rounded down to knownGrainTokens,
// as placementKey does in characters with the tree.
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
	return mix64(h)
}

// candIndex maps a worker id to its index among a decision's candidates: an open-addressing
// table of candidate indices + 1, at most half full, from a pool.
type candIndex struct {
	slots []int32
	mask  uint64
	buf   *[]int32
}

var indexPool = sync.Pool{New: func() any { b := make([]int32, 128); return &b }}

func newCandIndex(av []costCand) candIndex {
	n := 128
	for n < 2*len(av) {
		n *= 2
	}
	b := indexPool.Get().(*[]int32)
	if len(*b) < n {
		*b = make([]int32, n)
	}
	x := candIndex{slots: (*b)[:n], mask: uint64(n - 1), buf: b}
	clear(x.slots)
	for i := range av {
		h := maphash.String(idSeed, av[i].w.ID) & x.mask
		for x.slots[h] != 0 {
			h = (h + 1) & x.mask
		}
		x.slots[h] = int32(i + 1)
	}
	return x
}

// get returns id's index in av, −1 when it is no candidate.
func (x candIndex) get(av []costCand, id string) int {
	for h := maphash.String(idSeed, id) & x.mask; x.slots[h] != 0; h = (h + 1) & x.mask {
		if i := int(x.slots[h]) - 1; av[i].w.ID == id {
			return i
		}
	}
	return -1
}

func (x candIndex) release() { indexPool.Put(x.buf) }
