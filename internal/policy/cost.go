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

// The cost model of the cost-based policies (cache_aware_hash, precise_prefix, least_load); the
// decision runs it in pipeline order, gather → filter → score → pick, in decide.go.
//
//  1. Filter: the candidates not already tried, that flow control says can start the request,
//     available, and under the hard caps (CostConfig.MaxTokenUsage, CostConfig.MaxWaiting),
//     each while some candidate remains (decide.go's Filter* reasons).
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
//     engines' KV events, or 0 (least_load), with two recorded parts: Follow, the share of
//     the prompt past the routing text taken as cached where all of the routing text is
//     (CostConfig.FollowShare), and Credit, behind R replicas what the prompt's rendezvous
//     owner is credited of what no candidate is known to hold (Cost.creditOwner).
//     B_w  requests  the requests that will wait behind this prompt's prefill on w: the
//     prefill the engine reports queued (Q_w) in prompts of ū, the mean uncached prompt this
//     replica sends, times CostConfig.DelayShare (scorer.behind). Each of them waits
//     (P − Ĉ_w) ÷ μ_w longer for it; where no queue is, B is 0 and the cost is the request's
//     own wait.
//     μ_w  tokens/s  w's prefill rate, measured from its reports (loadmon.Estimate), starting
//     at CostConfig.PrefillRate.
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
	// FollowFixed keeps F at FollowShare. Default false: F is learned from what the answers
	// report cached past the routing text, with FollowShare as its prior (learn.go).
	FollowFixed bool `yaml:"follow_fixed"`
	// FollowRouteLearned prices Ĉ with the learned F. Default false: Ĉ counts FollowShare of
	// what follows a wholly held routing text, as before, and only the prediction (the audit,
	// the calibration) uses the learned F; measured in docs/routing.md §8.1, the learned F in the
	// cost gives up hits an overloaded fleet needs.
	FollowRouteLearned bool `yaml:"follow_route_learned"`
	// RateDecay is how much a worker's measured μ (the peak of its backlog's falls) decays per
	// measured poll interval, in [0,1]. Default 0.01 (an engine that slows to half is seen
	// to within about 70 busy intervals).
	RateDecay float64 `yaml:"rate_decay"`
	// RateSamples is how many busy poll intervals must measure a worker's μ before it replaces
	// PrefillRate. Default 4.
	RateSamples int `yaml:"rate_samples"`
	// RateCap bounds one poll interval's measured μ, as a multiple of PrefillRate, so that a
	// worker reporting nonsense cannot make itself look arbitrarily fast. Default 64.
	RateCap float64 `yaml:"rate_cap"`
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
	// LoRA holds the constants of the adapter term L (costlora.go).
	LoRA LoRACost `yaml:",inline"`
	// MinDecodeRate is the floor of D's fleet throughput, in generated tokens per second per
	// running request: no engine decodes slower, and a reported throughput that says so is a
	// moving average still catching up with its batch. Default 1.
	MinDecodeRate float64 `yaml:"min_decode_rate"`
	// MeanWindow is how many sent prompts the mean uncached prompt ū (B's unit, and Q's where
	// engines report request counts only) moves over, in requests. Default 64.
	MeanWindow float64 `yaml:"mean_window"`
	// HerdShare weighs the herd term H (costherd.go), in decode steps per request sent to the
	// worker within its current step and not yet reported. Default 0 (off).
	HerdShare float64 `yaml:"herd_share"`
	// BlindWindow is how long, in seconds, a peer's decision may take to reach this replica
	// over the sync plane: the blind term (costblind.go) counts this replica's own sends to a
	// worker within it once more for every live peer. 0 turns the term off. Default 0.002.
	BlindWindow float64 `yaml:"blind_window"`
	// RateFromCounters prices each prompt's own miss (P − Ĉ) at μp, the prefill rate an
	// engine's own counters give (loadmon/prefillrate.go), and the queue (Q, S, the delay to the
	// B requests behind) at μ, never below μp. Off by default: a prompt's time in prefill
	// includes the step its last token takes, so μp reads low where hits are many (fleet
	// simulator with --engine-prefill-counters: mixed speeds at 1 gateway 3.31 → 2.69 s, but
	// shared-prefix 0.22 → 0.80 s; docs/routing.md §8.2).
	RateFromCounters bool `yaml:"rate_from_counters"`
	// StepDelay adds the shared-step term K (coststep.go): the delay a prompt's prefill adds to
	// the first tokens of the requests sent to the worker within its current decode step, in
	// seconds, once that step's prefill outlasts its decode. Default false (off).
	StepDelay bool `yaml:"step_delay"`
	// PrefillChunk is the most prompt tokens an engine prefills in one step alongside its batch's
	// decode (vLLM's max_num_batched_tokens, SGLang's chunked_prefill_size), for K: a prompt
	// lengthens the step the requests before it complete in by its part of one chunk at most.
	// Default 2048.
	PrefillChunk float64 `yaml:"prefill_chunk"`
	// QueueSends adds the queued-sends term U (costqueue.go): S is at least the prefill of this
	// replica's sends since the report that an engine draining its queue at μ only while it
	// holds work has not done yet. Default false (off).
	QueueSends bool `yaml:"queue_sends"`
}

// DefaultCostConfig returns the cost model's defaults (see each field).
func DefaultCostConfig() CostConfig {
	return CostConfig{PrefillRate: 8000, BytesPerToken: 4, TieSeconds: 0.005,
		TieShare: 0.05, FollowShare: 1, RateDecay: 0.01, RateSamples: 4, RateCap: 64, DelayShare: 1, MaxTokenUsage: 1,
		MinDecodeRate: 1, MeanWindow: 64, BlindWindow: 0.002, PrefillChunk: 2048,
		LoRA: DefaultLoRACost()}
}

// withDefaults fills zero fields; a wholly zero config is the defaults. Otherwise FollowShare,
// DelayShare and MaxWaiting keep a zero, which means something (nothing follows; nobody behind
// counts; no cap).
func (c CostConfig) withDefaults() CostConfig {
	d := DefaultCostConfig()
	if c == (CostConfig{}) {
		return d
	}
	e := c.Estimate() // the engine estimate's constants take its defaults
	c.PrefillRate, c.BytesPerToken, c.RateDecay, c.RateSamples, c.RateCap = e.PrefillRate, e.BytesPerToken, e.RateDecay, e.RateSamples, e.RateCap
	for _, f := range [...]struct {
		v *float64
		d float64
	}{
		{&c.MinDecodeRate, d.MinDecodeRate}, {&c.MeanWindow, d.MeanWindow}, {&c.MaxTokenUsage, d.MaxTokenUsage},
		{&c.PrefillChunk, d.PrefillChunk},
	} {
		if *f.v == 0 {
			*f.v = f.d
		}
	}
	c.LoRA = c.LoRA.withDefaults()
	return c
}

// validate reports the first invalid cost constant. Each bound keeps a hostile or mistyped value
// from making the cost meaningless (a zero or negative rate, a negative ε).
func (c CostConfig) validate() error {
	if err := c.Estimate().Validate(); err != nil {
		return err // prefill_rate, bytes_per_token, rate_decay, rate_samples, rate_cap
	}
	switch {
	case !(c.TieSeconds >= 0) || c.TieSeconds > 60:
		return errors.New("tie_seconds must be in [0, 60]")
	case !(c.TieShare >= 0) || c.TieShare > 1:
		return errors.New("tie_share must be in [0, 1]")
	case !(c.FollowShare >= 0) || c.FollowShare > 1:
		return errors.New("follow_share must be in [0, 1]")
	case !(c.DelayShare >= 0) || c.DelayShare > 10:
		return errors.New("delay_share must be in [0, 10]")
	case !(c.MaxTokenUsage >= 0) || c.MaxTokenUsage > 1:
		return errors.New("max_token_usage must be in [0, 1]")
	case c.MaxWaiting < 0:
		return errors.New("max_waiting must be >= 0")
	case !(c.MinDecodeRate >= 0) || c.MinDecodeRate > 1e6:
		return errors.New("min_decode_rate must be in [0, 1e6] tokens/s per running request")
	case c.MeanWindow != 0 && !(c.MeanWindow >= 1) || c.MeanWindow > 1e6:
		return errors.New("mean_window must be in [1, 1e6] requests")
	case c.PrefillChunk != 0 && !(c.PrefillChunk >= 1) || c.PrefillChunk > 1e7:
		return errors.New("prefill_chunk must be in [1, 1e7] tokens")
	}
	if err := validHerdShare(c.HerdShare); err != nil {
		return err
	}
	if !(c.BlindWindow >= 0) || c.BlindWindow > 10 {
		return errors.New("blind_window must be in [0, 10] seconds")
	}
	return c.LoRA.validate()
}

// Estimate returns the constants of the engine estimate (loadmon.Estimate) the cost reads, which
// flow control's saturation judgement reads too: one prefill rate, one bytes-to-tokens rule.
func (c CostConfig) Estimate() loadmon.EstimateConfig {
	return loadmon.EstimateConfig{PrefillRate: c.PrefillRate, RateDecay: c.RateDecay, RateSamples: c.RateSamples,
		RateCap: c.RateCap, BytesPerToken: c.BytesPerToken}.WithDefaults()
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
	// Blind is the part of PeerSent the blind term estimated (costblind.go): what the peers
	// probably sent within the bus's delay, not yet heard of, in tokens.
	Blind float64
	// Prompt is P, the prompt, in tokens.
	Prompt float64
	// Cached is Ĉ, the part of the prompt predicted cached on the worker, in tokens, Follow and
	// Credit included.
	Cached float64
	// Follow is the part of Ĉ past the routing text, taken as cached because the worker holds
	// all of the routing text (CostConfig.FollowShare), in tokens.
	Follow float64
	// Credit is the part of Ĉ that is the prompt's rendezvous owner's credit behind several
	// replicas (Cost.creditOwner), not a prediction of the tree or the events, in tokens.
	Credit float64
	// Behind is B, the requests expected to wait behind this prompt's prefill on the worker,
	// weighted by CostConfig.DelayShare: each waits (P − Ĉ) ÷ μ longer for it.
	Behind float64
	// Rate is μ, the rate the worker drains its queued prefill at, in tokens per second: Q, S
	// and the delay to the B requests behind are priced at it.
	Rate float64
	// PromptRate is μp, the rate one prompt prefills at on the worker once started, in tokens
	// per second, as its own counters measure it (loadmon.Estimate.PromptRate): the prompt's own
	// P − Ĉ is priced at it. An engine that prefills several prompts at once drains its queue
	// faster than each prompt prefills. Equal to Rate where the engine counts no prefill time.
	PromptRate float64
	// Decode is D, the decode-side cost of joining the worker's batch, in seconds.
	Decode float64
	// Herd is H, what the requests sent to the worker within its current decode step and not
	// yet reported add to this one's wait, in seconds (costherd.go); 0 unless
	// CostConfig.HerdShare is set.
	Herd float64
	// StepSent is n of the shared-step term K (coststep.go): the requests this replica sent the
	// worker within its current decode step and not yet reported, times CostConfig.DelayShare;
	// 0 unless CostConfig.StepDelay.
	StepSent float64
	// StepTokens is X of K: the prefill the worker's next step carries before this prompt, in
	// tokens: the queued prefill (Q), then those requests' uncached tokens, at most
	// CostConfig.PrefillChunk.
	StepTokens float64
	// StepRoom is what is left of that step's chunk for this prompt, in tokens.
	StepRoom float64
	// Step is K, in seconds: what this prompt's prefill adds to the first tokens of those
	// requests, the next step's prefill being longer than its decode (coststep.go).
	Step float64
	// Unprefilled is U, in tokens: what of this replica's sends since the report the engine
	// cannot have prefilled yet, beyond Q (costqueue.go); S is at least it. 0 unless
	// CostConfig.QueueSends.
	Unprefilled float64
	// Adapter is L, what the request's LoRA adapter costs on the worker where it is not
	// running (a load, or the wait for a slot), in seconds (costlora.go).
	Adapter float64
	// Cost is Formula(), in seconds: the expected time to first token, with the delay the
	// prompt's prefill adds to the B requests behind it.
	Cost float64
}

// Formula returns the cost of the other terms, (Q + S + (P − Ĉ) × (1 + B)) ÷ μ + D, with L, H
// and K where they are on, in seconds; +Inf where a term is NaN (a hostile report). Ĉ beyond P
// counts as P.
func (t *Terms) Formula() float64 {
	return formula(t.Queued, t.Sent, t.Prompt, t.Cached, t.Behind, t.Rate, t.PromptRate, t.Decode) + t.Adapter + t.Herd + t.stepDelay()
}

// TTFT returns the prompt's own expected time to first token on the worker,
// (Q + S + P − Ĉ) ÷ μ + D, in seconds: the cost less the delay its prefill adds to the B
// requests behind it. It is what a decision predicts the client will see (the calibration
// metrics, admission by a TTFT objective); Cost is what the pick minimises.
func (t *Terms) TTFT() float64 {
	return formula(t.Queued, t.Sent, t.Prompt, t.Cached, 0, t.Rate, t.PromptRate, t.Decode) + t.Adapter + t.Herd
}

// price sets t.Cost (and K, t.Step) from the other terms.
func (t *Terms) price() {
	t.Step = t.stepDelay()
	t.Cost = formula(t.Queued, t.Sent, t.Prompt, t.Cached, t.Behind, t.Rate, t.PromptRate, t.Decode) + t.Adapter + t.Herd + t.Step
}

// formula is Terms.Formula on the terms themselves (the scorer never makes Q, S or B negative), so
// that pricing a candidate copies no Terms: the queue ahead and the delay to the B requests
// behind at the queue's rate μ, the prompt's own prefill at its own rate μp (μ where μp is 0).
func formula(q, s, p, c, b, mu, mup, d float64) float64 {
	miss := max(p-c, 0)
	if !(mup > 0) || mup == mu {
		return finite((q+s+miss*(1+b))/mu + d) // one rate: one division
	}
	return finite((q+s+miss*b)/mu + miss/mup + d)
}

// report is the part of a worker's load report the cost reads: a decision copies one per
// candidate, so it is kept small.
type report struct {
	polled                                           time.Time
	uncachedTokens, waiting, running, inflightAtPoll int64
	gen, usage, replicas                             float64
	tokenData, hasUncached                           bool
	lora                                             *loadmon.LoRA // nil: none reported (costlora.go)
	// rate is the engine's prefill rate read from its counters (Report.PrefillRate), 0 unknown.
	rate float64
	// busy is its prefill-busy counters (Report.Busy).
	busy loadmon.Busy
}

func reportOf(r *loadmon.Report) report {
	return report{polled: r.PolledAt, uncachedTokens: r.WaitingUncachedTokens, waiting: r.Waiting, running: r.Running,
		inflightAtPoll: r.InflightAtPoll, gen: r.GenThroughput, usage: r.TokenUsage, replicas: r.Replicas,
		tokenData: r.HasTokenData, hasUncached: r.HasUncachedTokens, lora: r.LoRA, rate: r.PrefillRate, busy: r.Busy()}
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
	// basis is what Ĉ (t.Cached) was made of, for learning from the answer (learn.go).
	basis Basis
	// peerTok and peerReq are what the peers sent w since its report (Peers.SentSinceAll),
	// when the sync plane is active; r.replicas is then 1.
	peerTok, peerReq float64
	// peerN is the live peers (Peers.Peers), for the blind term (costblind.go).
	peerN int
	// blindEps widens the tie window of a decision picking c (costblind.go), in seconds.
	blindEps float64
	t        Terms
}

// workerCost is what a replica remembers of one worker between decisions.
type workerCost struct {
	// est is the replica's picture of the engine (μ, Q, what it sent since the report).
	est loadmon.Estimate
	// idHash is the worker id's rendezvous hash (idHash), computed once.
	idHash uint64
	// adapters are the LoRA adapters this replica sent the worker since the report polled at
	// adaptersAt (costlora.go).
	adapters   []string
	adaptersAt time.Time
	// herd is this replica's latest sends to the worker, for the herd term (costherd.go).
	herd herdSends
	// queue is the worker's prefill queue as this replica's sends since its report make it, for
	// the queued-sends term (costqueue.go).
	queue sendQueue
}

// scorer is the filter and score steps of the pipeline, and the per-worker memory they need.
type scorer struct {
	cfg   CostConfig
	est   loadmon.EstimateConfig // cfg.Estimate()
	loads Loads
	now   func() time.Time
	// peers is the replica sync plane, nil without one (peers.go).
	peers Peers

	mu sync.Mutex
	ws map[string]*workerCost
	// pool is the last decision's candidates by position (poolView).
	pool poolView
	// meanUncached is a moving average of the uncached tokens of the prompts this replica sent,
	// for workers that report only request counts.
	meanUncached float64
	// burst is this replica's recent decisions and how many of its own decisions came within
	// CostConfig.BlindWindow of one another, for the blind term (costblind.go).
	burst burstRate
}

func newScorer(cfg CostConfig, loads Loads, now func() time.Time) *scorer {
	c := cfg.withDefaults()
	return &scorer{cfg: c, est: c.Estimate(), loads: loads, now: now, ws: map[string]*workerCost{}}
}

// promptTokens is P for a request that is not tokenized: the whole prompt's bytes (the routing
// text when the caller does not know more) in tokens.
func (s *scorer) promptTokens(req *Request) float64 {
	return s.est.Tokens(int64(max(req.PromptBytes, len(req.Text))))
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

func (s *scorer) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ws, id)
	// Every position is looked up again: none may keep the forgotten state.
	clear(s.pool.ws)
	s.pool.snap = nil
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

// String renders the terms for an audit header or a log line: the worker id, Q, S, P and Ĉ in
// whole tokens, B in requests (2 decimals), μ in tokens per second, D and the cost in seconds
// (3 decimals), then Ĉ's follow share and owner credit in whole tokens, μp in tokens per second
// where the engine's counters give one other than μ (mup=), L in seconds where it is not 0, H
// in seconds where the herd term is on (h=, only when not 0), U in whole tokens where the
// queued-sends term is on (u=, only when not 0), and with replica sync the part of S its peers
// sent (sp=, only when some) and the blind term's part of it (sb=, only when some). Every value
// is a number or the worker's id (a hash, no address), so it is safe
// in a header.
func (t Terms) String() string {
	b := make([]byte, 0, 96)
	b = append(b, "worker="...)
	b = append(b, t.Worker...)
	for _, f := range [...]struct {
		name string
		v    float64
		prec int
	}{{" q=", t.Queued, 0}, {" s=", t.Sent, 0}, {" p=", t.Prompt, 0}, {" c=", t.Cached, 0},
		{" b=", t.Behind, 2}, {" mu=", t.Rate, 0}, {" d=", t.Decode, 3}, {" cost=", t.Cost, 3},
		{" follow=", t.Follow, 0}, {" credit=", t.Credit, 0}} {
		b = append(b, f.name...)
		b = strconv.AppendFloat(b, f.v, 'f', f.prec, 64)
	}
	if t.PromptRate > 0 && t.PromptRate != t.Rate { // μp, where the engine's counters give it (§8.2)
		b = append(b, " mup="...)
		b = strconv.AppendFloat(b, t.PromptRate, 'f', 0, 64)
	}
	if t.Adapter != 0 { // L, for an adapter's request where it does not run (costlora.go)
		b = append(b, " l="...)
		b = strconv.AppendFloat(b, t.Adapter, 'f', 3, 64)
	}
	if t.Herd != 0 { // H, where the herd term is on (costherd.go)
		b = append(b, " h="...)
		b = strconv.AppendFloat(b, t.Herd, 'f', 3, 64)
	}
	if t.Step != 0 { // K, where the shared-step term charges something (coststep.go)
		b = append(b, " k="...)
		b = strconv.AppendFloat(b, t.Step, 'f', 3, 64)
	}
	if t.Unprefilled > 0 { // U, where the queued-sends term is on (costqueue.go)
		b = append(b, " u="...)
		b = strconv.AppendFloat(b, t.Unprefilled, 'f', 0, 64)
	}
	if t.PeerSent > 0 {
		b = append(b, " sp="...)
		b = strconv.AppendFloat(b, t.PeerSent, 'f', 0, 64)
	}
	if t.Blind > 0 { // the blind term's part of sp= (costblind.go)
		b = append(b, " sb="...)
		b = strconv.AppendFloat(b, t.Blind, 'f', 0, 64)
	}
	return string(b)
}

// RateReporter is implemented by policies that measure each engine's prefill rate μ (the
// cost-based ones): kvgate_worker_prefill_rate_tokens_per_second.
type RateReporter interface {
	// Rates returns worker id → the μ this replica prices the worker's queue at, in tokens a
	// second; a worker is absent until its reports measured μ (before that the cost takes
	// --prefill-rate).
	Rates() map[string]float64
}

// Rates returns each worker's measured μ (RateReporter).
func (p *Cost) Rates() map[string]float64 { return p.sc.rates() }

// rates returns each worker's measured μ, as Rate prices it, for the workers whose reports
// measured one.
func (s *scorer) rates() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.ws))
	for id, w := range s.ws {
		if _, n := w.est.Measured(); n >= s.est.RateSamples {
			out[id] = w.est.Rate(&s.est)
		}
	}
	return out
}
