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
	// BranchFallbackTokenizer: tokenization failed or missed its deadline; the tree gave Ĉ.
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
	// decideNS sums the time precise decisions took, tokenization and matching included;
	// decided counts them.
	decideNS, decided atomic.Int64
}

var (
	_ Policy           = (*Cost)(nil)
	_ Coster           = (*Cost)(nil)
	_ Forgetter        = (*Cost)(nil)
	_ DecisionReporter = (*Cost)(nil)
	_ Recorder         = (*Cost)(nil)
	_ CacheObserver    = (*Cost)(nil)
)

func newCost(name string, src source, cfg Config) *Cost {
	c := cfg.withDefaults()
	p := &Cost{name: name, src: src, sc: newScorer(c.Cost, c.Loads, c.Now, c.Peers), kv: c.KV,
		dec: newCounters(BranchCacheHit, BranchCacheMiss, BranchSpill)}
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
// one took, tokenization and matching included (fallbacks excluded).
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

// decide is Pick, recording the decision (tree, sends, counters) only when commit.
func (p *Cost) decide(ctx context.Context, candidates []*worker.Worker, req *Request, commit bool) *worker.Worker {
	if req == nil {
		req = &Request{}
	}
	var toks []uint32
	branch := -1
	if p.src == fromEvents {
		toks, branch = p.tokenize(ctx, candidates, req)
	}
	buf := getCands(len(candidates))
	av := *buf
	defer func() { putCands(buf, av) }()
	av = p.sc.gather(av, candidates, p.sc.promptTokens(req), true, !commit)
	if len(av) == 0 {
		return nil
	}
	if toks != nil {
		if key, ok := p.eventsCached(av, req, toks); ok {
			return p.finish(av, req, key, commit, coPreciseHit)
		}
		branch = coNoEvents
	}
	if branch >= 0 && commit {
		p.dec.add(branch)
	}
	if p.src == fromNothing || req.Text == "" {
		// No cache to agree on: ties go by the whole routing text, which spreads them.
		return p.finish(av, req, hashString(req.Text), commit, -1)
	}
	return p.treeCached(av, req, commit)
}

// tokenize returns the prompt's tokens for precise_prefix, before any load is read, under the
// request's context (the tokenizer bounds it by its own deadline too); nil with the fallback
// branch when the events cannot answer or the tokenizer fails.
func (p *Cost) tokenize(ctx context.Context, candidates []*worker.Worker, req *Request) ([]uint32, int) {
	if p.kv == nil || req.Text == "" && !req.Chat {
		return nil, coNoEvents
	}
	var idBuf [64]string
	ids := idBuf[:0]
	// Spread tokenization over the workers by the prompt's opening: the same opening asks the
	// same worker.
	key := hashString(prefixChars(req.Text, placementChars))
	var via *worker.Worker
	var viaScore uint64
	for _, w := range candidates {
		if w.Available() {
			ids = append(ids, w.ID)
			if s := score(key, w.ID); via == nil || s > viaScore {
				via, viaScore = w, s
			}
		}
	}
	if via == nil || !p.kv.Covers(req.Model, ids) {
		return nil, coNoEvents
	}
	toks, err := p.kv.Tokenize(ctx, via, req.Model, req.Chat, req.Body, req.Text)
	if err != nil || len(toks) == 0 {
		return nil, coTokenizer
	}
	return toks, -1
}

// eventsCached fills Ĉ from the engines' events and returns the placement key, ok false when the
// events cannot answer for every candidate.
func (p *Cost) eventsCached(av []costCand, req *Request, toks []uint32) (uint64, bool) {
	start := time.Now()
	var idBuf [64]string
	var outBuf [64]int
	ids, out := idBuf[:0], outBuf[:0]
	for i := range av {
		ids = append(ids, av[i].w.ID)
		out = append(out, 0)
	}
	if !p.kv.Match(req.Model, toks, ids, out) {
		return 0, false
	}
	// A chat request's whole messages were tokenized; other prompts only their routing text,
	// whose tail past it is counted in bytes.
	prompt := float64(len(toks))
	rest := 0.0
	if !req.Chat {
		rest = max(float64(req.PromptBytes-len(req.Text)), 0) / p.sc.cfg.BytesPerToken
	}
	for i := range av {
		av[i].t.Prompt = prompt + rest
		av[i].t.Cached = float64(out[i])
		if out[i] >= len(toks) {
			av[i].t.Cached += p.sc.cfg.FollowShare * rest
		}
	}
	p.decideNS.Add(int64(time.Since(start)))
	p.decided.Add(1)
	return tokenPlacementKey(toks, out), true
}

// treeCached fills Ĉ from the prefix tree and decides inside the tree's descent, so the text is
// recorded for the chosen worker at once (when commit).
func (p *Cost) treeCached(av []costCand, req *Request, commit bool) *worker.Worker {
	idx := newCandIndex(av)
	defer idx.release()
	routed := float64(len(req.Text)) / p.sc.cfg.BytesPerToken
	rest := max(av[0].t.Prompt-routed, 0)
	var chosen *worker.Worker
	p.tree.RouteDepths(req.Text, func(tenant string, chars int) {
		if i := idx.get(av, tenant); i >= 0 {
			av[i].t.Cached = float64(chars)
		}
	}, func(m *radix.Match) string {
		if p.sc.peers != nil && p.sc.peers.Active() {
			peerPlaced(p.sc.peers, av, req, m.Total)
		}
		known := 0.0 // the longest prefix the tree places on any candidate, in tokens
		for i := range av {
			c := &av[i].t
			full := int(c.Cached) >= m.Total
			c.Cached = c.Cached / p.sc.cfg.BytesPerToken
			if full && c.Cached > 0 {
				c.Cached += p.sc.cfg.FollowShare * rest
			}
			known = max(known, c.Cached)
		}
		key := hashString(placementKey(req.Text, m.Shared))
		p.creditOwner(av, key, known)
		chosen = p.finish(av, req, key, commit, -1)
		if !commit {
			return ""
		}
		return chosen.ID
	})
	return chosen
}

// creditOwner adds to Ĉ of the key's rendezvous owner what it is expected to hold of the part
// of a prompt that this replica's tree places on no candidate (past known, the longest prefix
// the tree places anywhere, in tokens): every replica places what it does not know on the same
// owner unless that costs more than the credit, so the owner holds it if it was sent before.
// The credit is that part times the probability that it was: with f = FollowShare the prior
// that a prompt was sent before (the tree's own assumption about what follows a matched
// opening) and R gateway replicas (the report's estimate), a prompt sent before went through
// another replica with probability 1 − 1/R, and the tree's not holding it rules out this one,
//
//	share = f × (1 − 1/R) ÷ (1 − f/R),
//
// which is 1 for f = 1 behind more than one replica and 0 behind one (that replica's tree sees
// everything). A prefix the tree does place is not the owner's to claim: prefix caches hold a
// prompt's tokens only after its opening, and this replica sent that opening elsewhere, so
// crediting the owner with it would pull a conversation off the worker that holds it (at 8
// gateways the slowest 1 % of multi-turn requests were that). The credit is bounded by the
// prompt, so a loaded owner still loses to an idle worker: bounded-load hashing, with the bound
// in seconds of prefill.
func (p *Cost) creditOwner(av []costCand, key uint64, known float64) {
	owner, best := 0, uint64(0)
	for i := range av {
		if s := scoreHashed(key, av[i].idHash); i == 0 || s > best {
			owner, best = i, s
		}
	}
	c := &av[owner]
	if !c.fresh || c.r.replicas <= 1 {
		return
	}
	f, r := p.sc.cfg.FollowShare, c.r.replicas
	share := f * (1 - 1/r) / (1 - f/r)          // r > 1, so the divisor is above 0
	c.credit = share * max(c.t.Prompt-known, 0) // known ≥ the owner's own Ĉ
	c.t.Cached += c.credit
}

// finish picks among av (every term filled), records the decision in req and, when commit,
// counts the branch and the tokens sent. branch overrides the counted branch when ≥ 0.
func (p *Cost) finish(av []costCand, req *Request, key uint64, commit bool, branch int) *worker.Worker {
	best, runner, most := p.sc.choose(av, key)
	record(req, av, best, runner)
	c := &av[best]
	d := &req.Decision
	switch {
	case c.t.Cached < most:
		d.Branch, branch = BranchSpill, ifElse(branch == coPreciseHit, coPreciseMiss, coSpill)
	case most == 0:
		d.Branch, branch = BranchCacheMiss, ifElse(branch == coPreciseHit, coPreciseMiss, coMiss)
	default:
		d.Branch, branch = BranchCacheHit, ifElse(branch == coPreciseHit, coPreciseHit, coHit)
	}
	if branch == coPreciseHit || branch == coPreciseMiss {
		d.Branch = p.dec.names[branch]
	}
	if p.src != fromNothing && c.t.Prompt > 0 {
		// The prediction audited against what the engine reports is the tree's or the events'
		// own: the owner's credit is an expectation learned from that audit, kept out of it.
		d.Predicted, d.HasPrediction, d.WholePrompt = min(c.t.Cached-c.credit, c.t.Prompt)/c.t.Prompt, true, true
	}
	if commit {
		p.dec.add(branch)
		p.sc.commit(c, c.t.Prompt-c.t.Cached)
		if p.sc.peers != nil {
			p.sc.peers.Decided(req.Model, c.w.ID, req.Text, req.ID, c.t.Prompt-c.t.Cached)
		}
		if p.src == fromEvents && req.Text != "" && branch >= coPreciseHit {
			p.tree.Insert(req.Text, c.w.ID) // keep the fallback's tree as warm as the default's
		}
	}
	return c.w
}

// ifElse returns a when cond, else b.
func ifElse(cond bool, a, b int) int {
	if cond {
		return a
	}
	return b
}

// Record records that req goes to w although this policy did not choose it (the sticky
// wrapper chose): the tree learns the text, the tokens count as sent to w, and req.Decision gets
// w's predicted share.
func (p *Cost) Record(req *Request, w *worker.Worker) {
	buf := getCands(1)
	av := *buf
	defer func() { putCands(buf, av) }()
	av = p.sc.gather(av, []*worker.Worker{w}, p.sc.promptTokens(req), false, false)
	if len(av) == 0 {
		req.decide("", 0, false)
		return
	}
	c := &av[0]
	if p.prefixTree != nil && req.Text != "" {
		p.tree.Route(req.Text, func(m *radix.Match) string {
			for _, t := range m.Tenants {
				if t == w.ID {
					c.t.Cached = float64(m.Chars) / p.sc.cfg.BytesPerToken
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
		p.sc.peers.Decided(req.Model, w.ID, req.Text, req.ID, c.t.Prompt-c.t.Cached)
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
