package policy

import (
	"errors"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// The cost pipeline of the cost-based policies (cache_aware_hash, precise_prefix, least_load):
// filter → score → pick, for every decision.
//
//  1. Filter: the available candidates, less those over a hard cap (CostConfig.MaxTokenUsage,
//     CostConfig.MaxWaiting) while some candidate is under it.
//  2. Score: each candidate's expected time to first token, in seconds, with the delay its
//     prefill adds to the requests that will queue behind it,
//
//     cost(w) = (Q_w + S_w + (P − Ĉ_w) × (1 + B_w)) ÷ μ_w + D_w
//
//     Q_w  tokens    the engine's reported queued uncached prefill (num_waiting_uncached_tokens)
//     less what it has prefilled since, at μ_w over the report's age; where only request
//     counts are reported, waiting requests × the mean uncached prompt this replica sends.
//     S_w  tokens    the uncached tokens this replica sent w since that report, times the
//     report's estimate of gateway replicas (every replica sends about as much), less
//     what the engine prefilled past Q since; with no fresh report, this replica's requests
//     in flight to w × the mean uncached prompt.
//     P    tokens    the prompt (tokenized, or its bytes ÷ CostConfig.BytesPerToken).
//     Ĉ_w  tokens    the part of it predicted cached on w: from the prefix tree, from the
//     engines' KV events, or 0 (least_load); behind R replicas the prompt's rendezvous
//     owner is credited what no candidate is known to hold (Cost.creditOwner).
//     B_w  requests  the requests that will wait behind this prompt's prefill on w: the
//     prefill the engine reports queued (Q_w) in prompts of ū, the mean uncached prompt this
//     replica sends, times CostConfig.DelayShare (scorer.behind). Each of them waits
//     (P − Ĉ_w) ÷ μ_w longer for it; where no queue is, B is 0 and the cost is the request's
//     own wait.
//     μ_w  tokens/s  w's prefill rate, measured from its reports (scorer.roll), starting at
//     CostConfig.PrefillRate.
//     D_w  seconds   the decode-side cost of joining w's batch: one decode step of the batch
//     it joins, the requests at the engine now (the report's, corrected by this replica's
//     sends and completions since, times the replica estimate) ÷ the fleet's mean
//     generation throughput per engine. A queue for batch slots is not a term of its own:
//     its requests' prefill is in Q already, in the unit a cache hit saves.
//  3. Pick: the least cost; every candidate within ε = TieSeconds + TieShare × that cost of it
//     is a tie, and ties go to the highest rendezvous score of the request's placement key, so
//     replicas that see slightly different loads still agree where a new prefix lives.
//
// Every decision records the terms of the chosen worker and of the runner-up (Decision.Chosen,
// Decision.RunnerUp). There is no regime switch: D is what keeps a decode-bound fleet even (a
// batch twice as large has steps twice as long), Q and S what keeps a prefill-bound one even,
// Ĉ what keeps a prompt where its cache is, exactly as far as the prefill it saves outweighs
// the queue it joins, and B what keeps an overloaded fleet's cache: where queues are long, the
// prefill a miss adds is paid by every request behind it, so a hit saves that many times over.

// CostConfig holds the cost model's constants (the cost-based policies). Every field is in the
// unit its doc names; zero fields take the defaults of DefaultCostConfig.
type CostConfig struct {
	// PrefillRate is μ for a worker whose rate is not measured yet, in prompt tokens per second.
	// Default 8000 (the simulator's engine; set it to the fleet's engines, --prefill-rate).
	PrefillRate float64 `yaml:"prefill_rate"`
	// BytesPerToken converts prompt bytes into tokens where the prompt is not tokenized.
	// Default 4.
	BytesPerToken float64 `yaml:"bytes_per_token"`
	// TieSeconds is the absolute part of ε, in seconds. Default 0.005.
	TieSeconds float64 `yaml:"tie_seconds"`
	// TieShare is the relative part of ε, a share of the least cost. Default 0.05.
	TieShare float64 `yaml:"tie_share"`
	// FollowShare is the share of the prompt past the routing text (which the prefix tree does
	// not see) taken as cached on a worker that holds all of the routing text, in [0,1]: a
	// conversation resends its history, so what follows a fully matched opening was most
	// likely sent along with it. Default 1.
	FollowShare float64 `yaml:"follow_share"`
	// RateDecay is how much a worker's measured μ (the peak of its backlog's falls) decays per
	// measured poll interval, in [0,1]. Default 0.01 (an engine that slows to half is seen
	// to within about 70 busy intervals).
	RateDecay float64 `yaml:"rate_decay"`
	// RateSamples is how many busy poll intervals must measure a worker's μ before it replaces
	// PrefillRate. Default 4.
	RateSamples int `yaml:"rate_samples"`
	// DelayShare weighs the requests queued behind a prompt's prefill (B), in [0, 10]: 1 counts
	// the time it makes each of them wait as much as its own wait, so the cost is the time to
	// first token the pick adds to the fleet; 0 is each request's own wait alone (a greedy
	// pick, which on an overloaded fleet gives up hits to shave its own queue). Default 1.
	DelayShare float64 `yaml:"delay_share"`
	// MaxTokenUsage is a hard cap: a worker whose fresh report shows KV-cache usage above it
	// (a share in [0,1]) is no candidate while some other is under it. Default 1 (off).
	MaxTokenUsage float64 `yaml:"max_token_usage"`
	// MaxWaiting is a hard cap: a worker whose fresh report shows more waiting requests than
	// this is no candidate while some other is under it. Default 0 (off).
	MaxWaiting int64 `yaml:"max_waiting"`
}

// DefaultCostConfig returns the cost model's defaults (see each field).
func DefaultCostConfig() CostConfig {
	return CostConfig{PrefillRate: 8000, BytesPerToken: 4, TieSeconds: 0.005,
		TieShare: 0.05, FollowShare: 1, RateDecay: 0.01, RateSamples: 4, DelayShare: 1, MaxTokenUsage: 1}
}

// withDefaults fills zero fields; a wholly zero config is the defaults. Otherwise FollowShare,
// DelayShare and MaxWaiting keep a zero, which means something (nothing follows; nobody behind
// counts; no cap).
func (c CostConfig) withDefaults() CostConfig {
	d := DefaultCostConfig()
	if c == (CostConfig{}) {
		return d
	}
	if c.PrefillRate == 0 {
		c.PrefillRate = d.PrefillRate
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = d.BytesPerToken
	}
	if c.RateDecay == 0 {
		c.RateDecay = d.RateDecay
	}
	if c.RateSamples == 0 {
		c.RateSamples = d.RateSamples
	}
	if c.MaxTokenUsage == 0 {
		c.MaxTokenUsage = d.MaxTokenUsage
	}
	return c
}

// validate reports the first invalid cost constant. Each bound keeps a hostile or mistyped value
// from making the cost meaningless (a zero or negative rate, a negative ε).
func (c CostConfig) validate() error {
	switch {
	case !(c.PrefillRate >= 0) || c.PrefillRate > 1e9:
		return errors.New("prefill_rate must be in [0, 1e9] tokens/s")
	case !(c.BytesPerToken >= 0) || c.BytesPerToken > 64:
		return errors.New("bytes_per_token must be in [0, 64]")
	case !(c.TieSeconds >= 0) || c.TieSeconds > 60:
		return errors.New("tie_seconds must be in [0, 60]")
	case !(c.TieShare >= 0) || c.TieShare > 1:
		return errors.New("tie_share must be in [0, 1]")
	case !(c.FollowShare >= 0) || c.FollowShare > 1:
		return errors.New("follow_share must be in [0, 1]")
	case !(c.RateDecay >= 0) || c.RateDecay > 1:
		return errors.New("rate_decay must be in [0, 1]")
	case c.RateSamples < 0 || c.RateSamples > 1000:
		return errors.New("rate_samples must be in [0, 1000]")
	case !(c.DelayShare >= 0) || c.DelayShare > 10:
		return errors.New("delay_share must be in [0, 10]")
	case !(c.MaxTokenUsage >= 0) || c.MaxTokenUsage > 1:
		return errors.New("max_token_usage must be in [0, 1]")
	case c.MaxWaiting < 0:
		return errors.New("max_waiting must be >= 0")
	}
	return nil
}

// Terms is one candidate's cost with every term, as a decision records it.
type Terms struct {
	// Worker is the candidate's id.
	Worker string
	// Queued is Q, the reported queued uncached prefill, in tokens.
	Queued float64
	// Sent is S, the uncached prefill sent since the report, in tokens: this replica's scaled
	// by the replica estimate, or, with the replica sync plane active, this replica's plus what
	// its peers sent (PeerSent of it).
	Sent float64
	// PeerSent is the part of Sent that peers sent (replica sync), in tokens; 0 without sync.
	PeerSent float64
	// Prompt is P, the prompt, in tokens.
	Prompt float64
	// Cached is Ĉ, the part of the prompt predicted cached on the worker, in tokens.
	Cached float64
	// Behind is B, the requests expected to wait behind this prompt's prefill on the worker,
	// weighted by CostConfig.DelayShare: each waits (P − Ĉ) ÷ μ longer for it.
	Behind float64
	// Rate is μ, the worker's prefill rate, in tokens per second.
	Rate float64
	// Decode is D, the decode-side cost of joining the worker's batch, in seconds.
	Decode float64
	// Cost is Formula(), in seconds: the expected time to first token, with the delay the
	// prompt's prefill adds to the B requests behind it.
	Cost float64
}

// Formula returns the cost of the other terms, (Q + S + (P − Ĉ) × (1 + B)) ÷ μ + D, in seconds;
// +Inf where a term is NaN (a hostile report). Ĉ beyond P counts as P.
func (t *Terms) Formula() float64 {
	return formula(t.Queued, t.Sent, t.Prompt, t.Cached, t.Behind, t.Rate, t.Decode)
}

// TTFT returns the prompt's own expected time to first token on the worker,
// (Q + S + P − Ĉ) ÷ μ + D, in seconds: the cost less the delay its prefill adds to the B
// requests behind it. It is what a decision predicts the client will see (the calibration
// metrics, admission by a TTFT objective); Cost is what the pick minimises.
func (t *Terms) TTFT() float64 {
	return formula(t.Queued, t.Sent, t.Prompt, t.Cached, 0, t.Rate, t.Decode)
}

// price sets t.Cost from the other terms.
func (t *Terms) price() {
	t.Cost = formula(t.Queued, t.Sent, t.Prompt, t.Cached, t.Behind, t.Rate, t.Decode)
}

// formula is Terms.Formula on the terms themselves (the scorer never makes Q, S or B negative), so
// that pricing a candidate copies no Terms.
func formula(q, s, p, c, b, mu, d float64) float64 {
	return finite((q+s+max(p-c, 0)*(1+b))/mu + d)
}

// report is the part of a worker's load report the cost reads: a decision copies one per
// candidate, so it is kept small.
type report struct {
	polled                                           time.Time
	uncachedTokens, waiting, running, inflightAtPoll int64
	gen, usage, replicas                             float64
	tokenData, hasUncached                           bool
}

func reportOf(r *loadmon.Report) report {
	return report{polled: r.PolledAt, uncachedTokens: r.WaitingUncachedTokens, waiting: r.Waiting, running: r.Running,
		inflightAtPoll: r.InflightAtPoll, gen: r.GenThroughput, usage: r.TokenUsage, replicas: r.Replicas,
		tokenData: r.HasTokenData, hasUncached: r.HasUncachedTokens}
}

// costCand is one candidate during a decision.
type costCand struct {
	w     *worker.Worker
	r     report
	fresh bool
	// st is the replica's state for w (scorer.ws[w.ID]).
	st *workerCost
	// ahead is the requests the engine has gained since the report (this replica's sends less
	// its completions, scaled; negative when more finished), for D.
	ahead float64
	// idHash is the worker id's rendezvous hash (idHash).
	idHash uint64
	// credit is the part of t.Cached that is the rendezvous owner's credit
	// (Cost.creditOwner), not a prediction of the tree or the events.
	credit float64
	// peerTok and peerReq are what the peers sent w since its report (Peers.SentSince), when
	// the sync plane is active; r.replicas is then 1.
	peerTok, peerReq float64
	t                Terms
}

// workerCost is what a replica remembers of one worker between decisions.
type workerCost struct {
	// polled is the PolledAt of the report that sentTok follows.
	polled time.Time
	// queued is that report's Q, in tokens; sentTok what this replica sent since.
	queued, sentTok float64
	// idHash is the worker id's rendezvous hash (idHash), computed once.
	idHash uint64
	// rate is the measured μ in tokens per second, 0 until measured; rated counts the
	// intervals that measured it.
	rate  float64
	rated int
}

// scorer is the filter and score steps of the pipeline, and the per-worker memory they need.
type scorer struct {
	cfg   CostConfig
	loads Loads
	now   func() time.Time
	// peers is the replica sync plane, nil without one.
	peers Peers

	mu sync.Mutex
	ws map[string]*workerCost
	// pool is the last decision's candidates by position (poolView).
	pool poolView
	// meanUncached is a moving average of the uncached tokens of the prompts this replica sent,
	// for workers that report only request counts.
	meanUncached float64
}

func newScorer(cfg CostConfig, loads Loads, now func() time.Time, peers Peers) *scorer {
	return &scorer{cfg: cfg.withDefaults(), loads: loads, now: now, peers: peers, ws: map[string]*workerCost{}}
}

// promptTokens is P for a request that is not tokenized: the whole prompt's bytes (the routing
// text when the caller does not know more) in tokens.
func (s *scorer) promptTokens(req *Request) float64 {
	return float64(max(req.PromptBytes, len(req.Text))) / s.cfg.BytesPerToken
}

// gather filters candidates (available, under the hard caps) into dst and fills every term but
// Ĉ, reading one load snapshot under the replica's lock. prompt is P in tokens. pool says that
// candidates is a decision's candidate list, which the scorer's poolView remembers; a one-off
// list (Record's single worker) is read directly and leaves the view alone.
func (s *scorer) gather(dst []costCand, candidates []*worker.Worker, prompt float64, pool, dry bool) []costCand {
	av := dst[:0]
	mon, pinned := s.loads.(*loadmon.Monitor)
	var snap loadmon.Pinned
	if pinned {
		snap = mon.Pin()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var v *poolView
	if pool {
		v = s.view(candidates, snap.Snapshot())
	}
	for i, w := range candidates {
		if !w.Available() {
			continue
		}
		c := costCand{w: w, t: Terms{Worker: w.ID, Prompt: prompt}}
		if v != nil {
			c.st = v.st[i]
		}
		switch {
		case !pinned:
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
	av = s.capped(av)
	if s.peers != nil && s.peers.Active() {
		peerSent(s.peers, av)
	}
	// The fleet's mean generation throughput per engine, for D (see terms), never below one
	// token a second per running request: no engine decodes slower, and a throughput that says
	// so is a moving average still catching up with its batch (after a start or a burst).
	var gen, running float64
	n := 0
	for i := range av {
		if av[i].fresh && av[i].r.gen > 0 {
			gen += av[i].r.gen
			running += float64(av[i].r.running)
			n++
		}
	}
	if n > 0 {
		gen = max(gen, running) / float64(n)
	}
	now := s.now()
	for i := range av {
		if av[i].st == nil {
			av[i].st = s.state(av[i].w.ID)
		}
		if dry && av[i].fresh && av[i].r.polled.After(av[i].st.polled) {
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

// poolView is what the scorer read for the last decision's candidate list, by position: each
// candidate's state and, as long as the load snapshot is the same one, its snapshot entry. A
// gateway passes the same list (the same workers in the same order) to decision after decision,
// so a decision normally looks nothing up by id: only a position whose worker changed, or every
// position when a new snapshot is published, is read again. A snapshot never changes once
// published, so what was read from it stays true; freshness, which depends on the clock, is
// checked at every decision. Guarded by scorer.mu.
type poolView struct {
	snap *loadmon.Snapshot // the snapshot rep and has were read from; nil: none
	ws   []*worker.Worker  // the candidate at each position
	st   []*workerCost     // its state (scorer.ws[id])
	rep  []report          // its snapshot entry's report, zero without one
	has  []bool            // whether it has an entry
}

// view brings s.pool up to date with candidates and snap (nil when the loads are no
// loadmon.Monitor: no entries are read) and returns it; the caller holds s.mu.
func (s *scorer) view(candidates []*worker.Worker, snap *loadmon.Snapshot) *poolView {
	v := &s.pool
	if n := len(candidates); len(v.ws) != n {
		// Another list: every position is read again (in the buffers it fits), and no worker or
		// state past its end is held.
		clear(v.ws[:cap(v.ws)])
		clear(v.st[:cap(v.st)])
		v.ws, v.st, v.rep, v.has = sized(v.ws, n), sized(v.st, n), sized(v.rep, n), sized(v.has, n)
	}
	reread := snap != v.snap
	v.snap = snap
	for i, w := range candidates {
		if v.ws[i] != w {
			v.ws[i], v.st[i] = w, s.state(w.ID)
		} else if !reread {
			continue
		}
		v.rep[i], v.has[i] = report{}, false
		if snap != nil {
			if e, ok := snap.Entry(w.ID); ok {
				v.rep[i], v.has[i] = reportOf(&e.Report), true
			}
		}
	}
	return v
}

// sized returns b resized to n, reusing its array when it is large enough.
func sized[T any](b []T, n int) []T {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]T, n)
}

// state returns the state the replica keeps for the worker with id, created on first sight; the
// caller holds s.mu.
func (s *scorer) state(id string) *workerCost {
	st := s.ws[id]
	if st == nil {
		st = &workerCost{idHash: idHash(id)}
		s.ws[id] = st
	}
	return st
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

// terms fills Q, S, μ and D of c as of now, gen being the fleet's mean generation throughput
// per engine (tokens/s; 0 when none reports one); c.st is set, and the caller holds s.mu.
func (s *scorer) terms(c *costCand, now time.Time, gen float64) {
	st := c.st
	c.idHash = st.idHash
	t := &c.t
	if !c.fresh {
		// No report to go by: this replica's own requests in flight are all it knows.
		t.Sent = float64(c.w.Inflight()) * s.meanUncached
		c.ahead = float64(c.w.Inflight())
		t.Rate = s.rateOf(st)
		s.behind(t)
		t.price()
		return
	}
	r := &c.r
	q := float64(r.uncachedTokens)
	if !r.hasUncached {
		q = float64(r.waiting) * s.meanUncached
	}
	rep := max(r.replicas, 1)
	if r.polled.After(st.polled) {
		s.roll(st, r.polled, q)
	}
	t.Rate = s.rateOf(st)
	if r.polled.Equal(st.polled) {
		t.Sent = st.sentTok * rep
	}
	t.Sent += c.peerTok
	t.PeerSent = c.peerTok
	// The requests at the engine now, as the global load of loadmon.ModeScaled counts them:
	// the report's, corrected by what this replica sent and saw finish since, times the
	// replica estimate. What finished since the report is no longer in the batch.
	local := c.w.Inflight()
	c.ahead = max(float64(local), float64(r.running+r.waiting)+rep*float64(local-r.inflightAtPoll)+c.peerReq) - float64(r.running+r.waiting)
	// The engine has been prefilling since the poll: what it had queued then, and then what
	// was sent it since, is that much less now (a report up to a poll interval old would
	// otherwise push work off an engine that has long finished it).
	done := t.Rate * max(now.Sub(r.polled).Seconds(), 0)
	t.Queued = max(q-done, 0)
	t.Sent = max(t.Sent-max(done-q, 0), 0)
	t.PeerSent = min(t.PeerSent, t.Sent)
	if gen > 0 {
		// A decode step lasts about (requests in the batch) ÷ (tokens per second per request
		// the fleet generates): the batch joined, with what was sent since the report, over the
		// fleet's mean throughput, so an engine with twice the mean batch counts twice the mean
		// step. The fleet's mean, not the engine's own throughput, because
		// an engine's is a moving average that lags its batch: after a burst it would make a
		// busy engine look arbitrarily slow and an idle one free.
		t.Decode = max(float64(r.running+r.waiting)+c.ahead, 0) / gen
	}
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
// 156 ms against 110 ms (docs/routing.md §9). B is 0 until this replica has sent a prompt (no
// mean yet).
func (s *scorer) behind(t *Terms) {
	t.Behind = 0
	if s.meanUncached > 0 {
		t.Behind = s.cfg.DelayShare * t.Queued / s.meanUncached
	}
}

// rateOf is μ of a worker: measured once RateSamples intervals measured it, else the configured
// start.
func (s *scorer) rateOf(st *workerCost) float64 {
	if st.rated >= s.cfg.RateSamples && st.rate > 0 {
		return st.rate
	}
	return s.cfg.PrefillRate
}

// roll moves st on to a newer report (polled, its Q in tokens) and measures μ over the interval
// since the previous one. While the engine still has prefill queued at the end of an interval
// it was prefilling throughout, so the fall of its backlog over the interval is a lower bound on
// its prefill rate, whatever anyone sent it meanwhile (sends only make the fall smaller), and
// equals the rate over an interval in which nothing arrived; an interval counts only when it
// began with more prefill queued than the current estimate drains in it. μ is the decaying peak of those
// falls (CostConfig.RateDecay per sample), so it approaches each engine's true rate at every
// replica alike, and an engine that slows down is seen to. Adding what this replica sent since
// the report would be closer on average but is biased: a send that hits the engine's cache
// queues less than predicted, so the engines that hold more would look faster and attract
// more. Samples are bounded to 64 × PrefillRate, so a worker reporting nonsense cannot make
// itself look arbitrarily fast.
func (s *scorer) roll(st *workerCost, polled time.Time, queued float64) {
	// Only an interval that began with at least a whole interval of prefill at the current
	// estimate says something: a small backlog falls as far as it is long, however fast the
	// engine is.
	if dt := polled.Sub(st.polled).Seconds(); !st.polled.IsZero() && dt > 0 && queued > 0 && st.queued > queued &&
		st.queued >= s.rateOf(st)*dt {
		fall := min((st.queued-queued)/dt, 64*s.cfg.PrefillRate)
		st.rate = max(fall, st.rate*(1-s.cfg.RateDecay))
		st.rated++
	}
	st.polled, st.queued, st.sentTok = polled, queued, 0
}

// commit records that c's worker was sent a prompt of which uncached tokens miss its cache.
func (s *scorer) commit(c *costCand, uncached float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ws[c.w.ID]
	if st == nil {
		return // forgotten meanwhile
	}
	if c.fresh && c.r.polled.Equal(st.polled) {
		st.sentTok += uncached
	}
	const window = 64 // requests over which the mean uncached prompt moves
	if s.meanUncached == 0 {
		s.meanUncached = uncached
	} else {
		s.meanUncached += (uncached - s.meanUncached) / window
	}
}

func (s *scorer) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ws, id)
	// Every position is looked up again: none may keep the forgotten state.
	clear(s.pool.ws)
	s.pool.snap = nil
}

// choose is the pick step: it prices every candidate (Ĉ filled in by the caller) and returns the
// index of the chosen one and of the runner-up (−1 when there is one candidate), and the most
// of the prompt predicted cached on any candidate (after clamping Ĉ to [0, P]).
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
	eps := s.cfg.TieSeconds + s.cfg.TieShare*av[least].t.Cost
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

// candPool recycles the candidate buffers of decisions.
var candPool = sync.Pool{New: func() any { b := make([]costCand, 0, 64); return &b }}

func getCands(n int) *[]costCand {
	b := candPool.Get().(*[]costCand)
	if cap(*b) < n {
		*b = make([]costCand, 0, n)
	}
	return b
}

func putCands(b *[]costCand, used []costCand) {
	clear(used) // hold no worker alive from the pool
	*b = (*b)[:0]
	candPool.Put(b)
}

// finite turns a NaN cost (from a hostile report) into +Inf, which loses every comparison.
func finite(x float64) float64 {
	if math.IsNaN(x) {
		return math.Inf(1)
	}
	return x
}

// String renders the terms for an audit header or a log line: the worker id, Q, S, S's part
// from peers (sp), P and Ĉ in
// whole tokens, B in requests (2 decimals), μ in tokens per second, D and the cost in seconds
// (3 decimals). Every value is a number or the worker's id (a hash, no address), so it is safe
// in a header.
func (t Terms) String() string {
	b := make([]byte, 0, 96)
	b = append(b, "worker="...)
	b = append(b, t.Worker...)
	for _, f := range [...]struct {
		name string
		v    float64
		prec int
	}{{" q=", t.Queued, 0}, {" s=", t.Sent, 0}, {" sp=", t.PeerSent, 0}, {" p=", t.Prompt, 0}, {" c=", t.Cached, 0},
		{" b=", t.Behind, 2}, {" mu=", t.Rate, 0}, {" d=", t.Decode, 3}, {" cost=", t.Cost, 3}} {
		b = append(b, f.name...)
		b = strconv.AppendFloat(b, f.v, 'f', f.prec, 64)
	}
	return string(b)
}
