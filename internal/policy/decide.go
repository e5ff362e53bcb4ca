package policy

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/radix"
	"github.com/kvgate/kvgate/internal/worker"
)

// One decision of a cost-based policy, top-down, in the order it runs (the cost itself is in
// cost.go's package comment):
//
//  1. gather  the prompt's tokens (precise_prefix: fetched by Prepare), one pinned load snapshot, each candidate's
//     report and the replica's estimate of its engine (loadmon.Estimate);
//  2. filter  every reason a worker is out, in one list (Filter*), each counted in
//     Decision.Filtered: already tried and cannot start (Choose, from the request), unavailable
//     and capped (here);
//  3. score   every term of every candidate (Terms: Q, S, P, Ĉ with its follow share and the
//     owner's credit, B, μ, D), Ĉ from the policy's source (none, the tree, the events);
//  4. pick    the least cost, ties by the placement key's rendezvous score; the decision records
//     the chosen and the runner-up's terms, and, when it commits, the estimate what was sent.

// Filter reasons: why a candidate is out of a decision, in the order they are applied. Each
// drops its workers only while some candidate remains.
const (
	// FilterTried: an earlier attempt of the request went to the worker (Request.Tried).
	FilterTried = iota
	// FilterCannotStart: flow control judged that the worker cannot start the request now
	// (Request.Startable).
	FilterCannotStart
	// FilterUnavailable: the worker is not Available (unhealthy, breaker open, draining).
	FilterUnavailable
	// FilterCapped: the worker's fresh report is over a hard cap (CostConfig.MaxTokenUsage,
	// CostConfig.MaxWaiting).
	FilterCapped
	// NumFilters is the number of filter reasons.
	NumFilters
)

// FilterNames names the filter reasons, by index, for metrics.
var FilterNames = [NumFilters]string{"tried", "cannot_start", "unavailable", "capped"}

// filterRequest applies the request's own filters (FilterTried, then FilterCannotStart on a first
// attempt) to candidates, counting what each drops in req.Decision.Filtered. A retry sees the
// candidates not yet tried while any of them is available, else all again; a first attempt the
// ones flow control says can start it, while any can.
func filterRequest(candidates []*worker.Worker, req *Request) []*worker.Worker {
	d := &req.Decision
	if len(req.Tried) > 0 {
		rest := make([]*worker.Worker, 0, len(candidates))
		tried := 0
		for _, w := range candidates {
			switch {
			case containsWorker(req.Tried, w):
				tried++
			case w.Available():
				rest = append(rest, w)
			}
		}
		if len(rest) == 0 {
			return candidates
		}
		d.Filtered[FilterTried] += int32(tried)
		return rest
	}
	if req.Startable != nil {
		out := req.Startable(candidates)
		d.Filtered[FilterCannotStart] += int32(len(candidates) - len(out))
		return out
	}
	return candidates
}

func containsWorker(ws []*worker.Worker, w *worker.Worker) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}

// decide is Pick, recording the decision (tree, sends, counters) only when commit.
func (p *Cost) decide(ctx context.Context, candidates []*worker.Worker, req *Request, commit bool) *worker.Worker {
	if req == nil {
		req = &Request{}
	}
	// 1. Gather, 2. filter: the prompt's tokens Prepare fetched (precise.go: no I/O here),
	// then the loads.
	var toks []uint32
	branch := -1
	if p.src == fromEvents && p.eventsAnswer(req) { // loraevents.go
		toks, branch = p.preparedTokens(candidates, req)
	}
	buf := getCands(len(candidates))
	av := *buf
	defer func() { putCands(buf, av) }()
	av = p.sc.gather(av, candidates, p.sc.promptTokens(req), req, true, !commit)
	if len(av) == 0 {
		return nil
	}
	p.sc.adapterTerms(av, req.Adapter) // L, the adapter term (costlora.go)
	// 3. Score (Ĉ from the first source that answers for every candidate) and 4. pick.
	pick := func(key uint64) *worker.Worker { return p.finish(av, req, key, commit, branch) }
	if toks != nil {
		branch = coPreciseHit
		if w, ok := p.eventsCached(av, req, toks, pick); ok {
			return w
		}
		branch = coNoEvents
	}
	if p.src == fromNothing || req.Text == "" {
		return noneCached(req, pick)
	}
	return p.treeCached(av, req, commit, pick)
}

// The sources of Ĉ (the policy's source: none for least_load, the tree for cache_aware_hash, the
// events and then the tree for precise_prefix) each fill Terms.Cached, with Terms.Follow and
// Terms.Credit, of every candidate and call pick once with the prompt's placement key. They are
// called directly rather than through an interface: a closure passed through an interface
// method escapes, and a decision would allocate (4 allocations, +12 % on
// BenchmarkDecisionWithMonitor/cache_aware_hash when measured).

// noneCached is least_load's source: Ĉ = 0.
func noneCached(req *Request, pick func(uint64) *worker.Worker) *worker.Worker {
	// No cache to agree on: ties go by the whole routing text, which spreads them.
	return pick(hashString(req.Text))
}

// gather reads one load snapshot under the replica's lock for candidates, filters them
// (available, under the hard caps, each drop counted in req.Decision.Filtered) into dst and
// fills every term but Ĉ. prompt is P in tokens. pool says that candidates is a decision's
// candidate list, which the scorer's poolView remembers; a one-off list (Record's single worker)
// is read directly and leaves the view alone.
func (s *scorer) gather(dst []costCand, candidates []*worker.Worker, prompt float64, req *Request, pool, dry bool) []costCand {
	av := dst[:0]
	// One snapshot at one instant for every candidate, where the loads publish snapshots.
	var snap loadmon.Pinned
	pinned, hasPin := s.loads.(pinner)
	if hasPin {
		snap = pinned.Pin()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var v *poolView
	if pool {
		v = s.view(candidates, snap.Snapshot())
	}
	for i, w := range candidates {
		if !w.Available() {
			req.Decision.Filtered[FilterUnavailable]++
			continue
		}
		c := costCand{w: w, t: Terms{Worker: w.ID, Prompt: prompt}}
		if v != nil {
			c.st = v.st[i]
		}
		switch {
		case !hasPin:
			r, fresh := s.loads.Report(w)
			c.r, c.fresh = reportOf(&r), fresh
		case v != nil:
			if v.has[i] && snap.Fresh(v.rep[i].polled) {
				c.r, c.fresh = v.rep[i], true
			}
		default:
			r, fresh := snap.Report(w)
			c.r, c.fresh = reportOf(&r), fresh
		}
		av = append(av, c)
	}
	n := len(av)
	av = s.capped(av)
	req.Decision.Filtered[FilterCapped] += int32(n - len(av))
	if s.peers != nil && s.peers.Active() {
		peerSent(s.peers, av) // the peers' sends are counted, not estimated (peers.go)
	}
	gen := s.cfg.fleetGen(av)
	now := s.now()
	for i := range av {
		if av[i].st == nil {
			av[i].st = s.state(av[i].w.ID)
		}
		if dry && av[i].fresh && av[i].r.polled.After(av[i].st.est.Polled()) {
			// A price asked without a pick (BestCost) moves a copy on to the new report: the
			// state, μ's measurement with it, moves only with decisions, so how often anyone
			// asks cannot change what the picks measure.
			st := *av[i].st
			av[i].st = &st
		}
		s.terms(&av[i], now, gen)
	}
	return av
}

// pinner is implemented by loads that publish immutable snapshots (*loadmon.Monitor): a decision
// reads every candidate from one, pinned at one instant.
type pinner interface {
	Pin() loadmon.Pinned
}

// fleetGen is the fleet's mean generation throughput per engine, for D (see terms), never below
// MinDecodeRate tokens a second per running request: no engine decodes slower, and a throughput
// that says so is a moving average still catching up with its batch (after a start or a burst).
func (c *CostConfig) fleetGen(av []costCand) float64 {
	var gen, running float64
	n := 0
	for i := range av {
		if av[i].fresh && av[i].r.gen > 0 {
			gen += av[i].r.gen
			running += float64(av[i].r.running)
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return max(gen, c.MinDecodeRate*running) / float64(n)
}

// capped drops the candidates over a hard cap, unless that would drop them all.
func (s *scorer) capped(av []costCand) []costCand {
	if s.cfg.MaxTokenUsage >= 1 && s.cfg.MaxWaiting == 0 {
		return av // both caps off
	}
	over := func(c *costCand) bool {
		return c.fresh && (c.r.tokenData && c.r.usage > s.cfg.MaxTokenUsage ||
			s.cfg.MaxWaiting > 0 && c.r.waiting > s.cfg.MaxWaiting)
	}
	n := 0
	for i := range av {
		if !over(&av[i]) {
			n++
		}
	}
	if n == 0 || n == len(av) {
		return av
	}
	k := 0
	for i := range av {
		if !over(&av[i]) {
			av[k] = av[i]
			k++
		}
	}
	clear(av[k:])
	return av[:k]
}

// terms fills Q, S, μ, B and D of c as of now, gen being the fleet's mean generation throughput
// per engine (tokens/s; 0 when none reports one); c.st is set, and the caller holds s.mu.
func (s *scorer) terms(c *costCand, now time.Time, gen float64) {
	st := c.st
	c.idHash = st.idHash
	t := &c.t
	if !c.fresh {
		// No report to go by: this replica's own requests in flight are all it knows.
		t.Sent = float64(c.w.Inflight()) * s.meanUncached
		c.ahead = float64(c.w.Inflight())
		t.Rate, t.PromptRate = st.est.Rate(&s.est), st.est.PromptRate(&s.est)
		s.behind(t)
		t.price()
		return
	}
	r := &c.r
	q := float64(r.uncachedTokens)
	if !r.hasUncached {
		q = float64(r.waiting) * s.meanUncached
	}
	if r.polled.After(st.est.Polled()) {
		st.est.Observe(r.polled, q, r.running, r.waiting, r.busy, &s.est)
		if r.rate > 0 && s.cfg.RateFromCounters {
			st.est.ObservePromptRate(r.rate, &s.est) // the engine's own counters (loadmon/prefillrate.go)
		}
	}
	t.Rate, t.PromptRate = st.est.Rate(&s.est), st.est.PromptRate(&s.est)
	s.blind(c, now) // the peers' decisions not yet heard of (costblind.go)
	if st.est.Follows(r.polled) {
		// The engine has been prefilling since the poll: what it had queued then, and then what
		// was sent it since, is that much less now (a report up to a poll interval old would
		// otherwise push work off an engine that has long finished it).
		t.Queued, t.Sent = st.est.Prefill(now, r.replicas, &s.est)
		if c.peerTok > 0 {
			// The peers' sends join S before what the engine prefilled past Q since the report
			// is taken off, as this replica's own are (Prefill at the report's instant is the
			// own share before any is taken off).
			_, own := st.est.Prefill(r.polled, r.replicas, &s.est)
			past := max(t.Rate*max(now.Sub(r.polled).Seconds(), 0)-q, 0)
			t.Sent = max(own+c.peerTok-past, 0)
			t.PeerSent = min(c.peerTok, t.Sent)
		}
	} else {
		t.Queued = max(q-t.Rate*max(now.Sub(r.polled).Seconds(), 0), 0) // an older report than the estimate's
	}
	s.queuedSends(c, now) // U, the sends the engine cannot have prefilled (costqueue.go)
	// The requests at the engine now (loadmon.Estimate.Requests), beyond what the report counts.
	c.ahead = st.est.RequestsAt(r.running+r.waiting, r.inflightAtPoll, r.replicas, c.w.Inflight()) + c.peerReq - float64(r.running+r.waiting)
	if gen > 0 {
		// A decode step lasts about (requests in the batch) ÷ (tokens per second per request
		// the fleet generates): the batch joined, with what was sent since the report, over the
		// fleet's mean throughput, so an engine with twice the mean batch counts twice the mean
		// step. The fleet's mean, not the engine's own throughput, because an engine's is a
		// moving average that lags its batch: after a burst it would make a busy engine look
		// arbitrarily slow and an idle one free.
		t.Decode = max(float64(r.running+r.waiting)+c.ahead, 0) / gen
	}
	s.herd(c, now)
	s.blindTies(c)
	s.stepSends(c, now) // K's sends, priced with Ĉ (coststep.go)
	s.behind(t)
	t.price()
}

// behind sets B of t (Q set): the requests that will queue behind the prompt while it waits,
// times DelayShare. An engine with prefill queued is admitting work as fast as it prefills, about
// μ ÷ ū requests a second (ū the mean uncached prompt this replica sends), and the prompt waits
// Q ÷ μ seconds before its own prefill starts: Q ÷ ū requests come in behind it meanwhile, and
// each waits for its prefill. Where only request counts are reported, Q is waiting requests × ū,
// so B is the waiting requests. Only the queue the engine reports counts, not S: what this
// replica sent since the report is mostly admitted already on a fleet that is not saturated, and
// S × the replica estimate counted as a queue made precise_prefix's multi-turn p99 at 8 gateways
// 156 ms against 110 ms (docs/history/routing-rule-based-default.md). B is 0 until this replica has sent a prompt (no
// mean yet).
func (s *scorer) behind(t *Terms) {
	t.Behind = 0
	if s.meanUncached > 0 {
		t.Behind = s.cfg.DelayShare * t.Queued / s.meanUncached
	}
}

// eventsCached is precise_prefix's source: Ĉ from the engines' KV events for the prompt's tokens;
// ok false (nothing picked) when the events cannot answer for every candidate.
func (p *Cost) eventsCached(av []costCand, req *Request, toks []uint32, pick func(uint64) *worker.Worker) (*worker.Worker, bool) {
	start := time.Now()
	var idBuf [64]string
	var outBuf [64]int
	ids, out := idBuf[:0], outBuf[:0]
	for i := range av {
		ids = append(ids, av[i].w.ID)
		out = append(out, 0)
	}
	partial := false
	if !p.matchEvents(req, toks, ids, out) {
		// Salted prompts and adapters' match only whole-fleet answers: the per-worker path meets
		// the base model's unsalted blocks.
		if partial = !req.Salted && req.Adapter == "" && p.matchEach(req.Model, toks, ids, out); !partial { // partialkv.go
			return nil, false
		}
	}
	partial = p.undrift(av, len(toks), out) || partial // precisedrift.go
	// A chat request's whole messages were tokenized; other prompts only their routing text,
	// whose tail past it is counted in bytes.
	prompt := float64(len(toks))
	rest := 0.0
	if !req.Chat {
		rest = p.sc.est.Tokens(int64(max(req.PromptBytes-len(req.Text), 0)))
	}
	for i := range av {
		t := &av[i].t
		t.Prompt = prompt + rest
		t.Cached = float64(out[i])
		if out[i] >= len(toks) {
			t.Follow = p.sc.cfg.FollowShare * rest
			t.Cached += t.Follow
		}
	}
	if partial {
		p.treeFill(av, req, out) // the engines without events, from the tree
	}
	p.decideNS.Add(int64(time.Since(start)))
	p.decided.Add(1)
	return pick(affinityKey(req, tokenPlacementKey(toks, out))), true
}

// treeCached is cache_aware_hash's source (and precise_prefix's fallback): Ĉ from this replica's
// prefix tree. It picks inside the tree's descent, so that the text is recorded for the chosen
// worker (when commit) before anything can change the match: a pick outside it would walk the
// tree twice per decision.
func (p *Cost) treeCached(av []costCand, req *Request, commit bool, pick func(uint64) *worker.Worker) *worker.Worker {
	idx := newCandIndex(av)
	defer idx.release()
	routed := p.sc.est.Tokens(int64(len(req.Text)))
	rest := max(av[0].t.Prompt-routed, 0)
	var chosen *worker.Worker
	prior := p.tree.RouteAged(req.Text, func(tenant string, chars int) {
		if i := idx.get(av, tenant); i >= 0 {
			av[i].t.Cached = float64(req.promptChars(chars))
		}
	}, func(m *radix.Match) string {
		if p.sc.peers != nil && p.sc.peers.Active() {
			peerPlaced(p.sc.peers, av, req, m.Total)
		}
		known := 0.0 // the longest prefix the tree places on any candidate, in tokens
		class := followOwn
		if m.Shared >= m.Total {
			class = followShared
		}
		f := p.followShare(class) // F, learned from the answers (learn.go)
		for i := range av {
			c := &av[i].t
			full := int(c.Cached) >= req.promptChars(m.Total)
			b := &av[i].basis
			*b = Basis{RoutedChars: int(c.Cached), Rest: rest}
			c.Cached = p.sc.est.Tokens(int64(c.Cached))
			b.Routed = c.Cached
			if full && c.Cached > 0 {
				b.Follow, b.RouteFollow, b.Class = p.expectedFollow(class, f)*rest, f*rest, class
				if !p.sc.cfg.FollowRouteLearned {
					b.RouteFollow = p.sc.cfg.FollowShare * rest
				}
				c.Follow = b.RouteFollow
				c.Cached += c.Follow
			}
			known = max(known, c.Cached)
		}
		key := affinityKey(req, hashString(placementKey(req.Text, m.Shared)))
		p.creditOwner(av, key, known)
		chosen = pick(key)
		if !commit {
			return ""
		}
		return chosen.ID
	})
	p.routed(req, chosen, prior, commit) // learntail.go
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
// in seconds of prefill. It is recorded as Terms.Credit, part of Terms.Cached.
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
	share := f * (1 - 1/r) / (1 - f/r)            // r > 1, so the divisor is above 0
	c.t.Credit = share * max(c.t.Prompt-known, 0) // known ≥ the owner's own Ĉ
	c.t.Cached += c.t.Credit
}

// finish is the pick step: it picks among av (every term filled), records the decision in req
// and, when commit, counts the branch and the tokens sent. branch is the precise branch the
// decision took (coPreciseHit when the events answered, a fallback branch when they did not,
// −1 for the other policies): a fallback decision counts as that fallback alone.
func (p *Cost) finish(av []costCand, req *Request, key uint64, commit bool, branch int) *worker.Worker {
	best, runner, most := p.sc.choose(av, key)
	record(req, av, best, runner)
	c := &av[best]
	d := &req.Decision
	precise, counted := branch == coPreciseHit, branch
	switch {
	case c.t.Cached < most:
		d.Branch, branch = BranchSpill, ifElse(precise, coPreciseMiss, coSpill)
	case most == 0:
		d.Branch, branch = BranchCacheMiss, ifElse(precise, coPreciseMiss, coMiss)
	default:
		d.Branch, branch = BranchCacheHit, ifElse(precise, coPreciseHit, coHit)
	}
	if precise {
		d.Branch = p.dec.names[branch]
	}
	if p.src != fromNothing && c.t.Prompt > 0 {
		// The prediction audited against what the engine reports is the tree's or the events'
		// own, with the share of the owner's credit and of the tail past the routing text that
		// the answers showed held (learn.go).
		expected := c.t.Cached - c.t.Credit + p.ownerHeld(c.t.Credit) - c.basis.RouteFollow + c.basis.Follow
		d.Predicted, d.HasPrediction, d.WholePrompt = min(max(expected, 0), c.t.Prompt)/c.t.Prompt, true, true
		d.Basis, d.At = c.basis, p.sc.now()
		d.Basis.Credit = c.t.Credit
	}
	if counted != coNoEvents && counted != coTokenizer {
		counted = branch
	}
	if commit {
		p.dec.add(counted)
		p.countFiltered(&req.Decision)
		p.sc.commit(c, c.t.Prompt-c.t.Cached)
		if p.sc.peers != nil {
			peerDecided(p.sc.peers, req, c.w.ID, c.t.Prompt-c.t.Cached)
		}
		p.sc.sentAdapter(c, req.Adapter)
		if precise {
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

// choose prices every candidate (Ĉ filled in by the source) and returns the index of the chosen
// one and of the runner-up (−1 when there is one candidate), and the most of the prompt predicted
// cached on any candidate (after clamping Ĉ to [0, P]).
func (s *scorer) choose(av []costCand, key uint64) (best, runner int, most float64) {
	// One pass prices and ranks: least is the first candidate of least cost, second the first of
	// least cost among the others, so the runner-up is whichever of the two is not chosen.
	least, second := 0, -1
	for i := range av {
		t := &av[i].t
		t.Cached = min(max(t.Cached, 0), t.Prompt)
		t.price()
		most = max(most, t.Cached)
		switch {
		case i == 0:
		case t.Cost < av[least].t.Cost:
			least, second = i, least
		case second < 0 || t.Cost < av[second].t.Cost:
			second = i
		}
	}
	// The ties within ε of the least go to the highest rendezvous score of key.
	eps := s.cfg.TieSeconds + s.cfg.TieShare*av[least].t.Cost + av[least].blindEps
	limit := av[least].t.Cost + eps
	best = least
	var bestScore uint64
	n := 0
	for i := range av {
		if av[i].t.Cost > limit {
			continue
		}
		n++
		if sc := scoreHashed(key, av[i].idHash); n == 1 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	if best != least {
		return best, least, most
	}
	return best, second, most
}

// record writes the decision's terms into req.
func record(req *Request, av []costCand, best, runner int) {
	if req == nil {
		return
	}
	d := &req.Decision
	d.HasCost = true
	d.Chosen = av[best].t
	d.RunnerUp = Terms{}
	if runner >= 0 {
		d.RunnerUp = av[runner].t
	}
}

// commit records that c's worker was sent a prompt of which uncached tokens miss its cache.
func (s *scorer) commit(c *costCand, uncached float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ws[c.w.ID]
	if st == nil {
		return // forgotten meanwhile
	}
	if c.fresh && st.est.Follows(c.r.polled) {
		st.est.Sent(loadmon.Own, c.t.Prompt, uncached)
	}
	s.queueSent(st, c, uncached) // costqueue.go (reads the clock only when the term is on)
	if s.cfg.HerdShare > 0 || s.cfg.StepDelay || s.peers != nil {
		now := s.now()
		st.herd.add(now, uncached)
		s.burst.add(now, s.cfg.BlindWindow, s.cfg.MeanWindow)
	}
	if s.meanUncached == 0 {
		s.meanUncached = uncached
	} else {
		s.meanUncached += (uncached - s.meanUncached) / s.cfg.MeanWindow
	}
}
