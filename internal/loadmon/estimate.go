package loadmon

import (
	"errors"
	"math"
	"time"
)

// Origin says who sent a request an Estimate is told of, or saw it finish.
type Origin uint8

const (
	// Own is this gateway replica.
	Own Origin = iota
	// Peer is another gateway replica, as replica sync relays it. Once an estimate has been told
	// of a peer's send since its report, what replicas sent it is the sum of what each said, and
	// this replica's own share is no longer scaled by the report's replica estimate.
	Peer
)

// EstimateConfig holds the constants of the engine estimate, each in the unit its doc names.
// Zero fields take the defaults of DefaultEstimateConfig.
type EstimateConfig struct {
	// PrefillRate is μ for an engine whose rate is not measured yet, in prompt tokens per
	// second. Default 8000 (--prefill-rate).
	PrefillRate float64 `yaml:"prefill_rate"`
	// RateDecay is how much a measured μ (the peak of the backlog's falls) decays per measured
	// poll interval, in [0,1]. Default 0.01 (an engine that slows to half is seen to within
	// about 70 busy intervals).
	RateDecay float64 `yaml:"rate_decay"`
	// RateSamples is how many busy poll intervals must measure μ before it replaces
	// PrefillRate. Default 4.
	RateSamples int `yaml:"rate_samples"`
	// RateCap bounds one interval's measured μ, as a multiple of PrefillRate, so that an
	// engine reporting nonsense cannot make itself look arbitrarily fast. Default 64.
	RateCap float64 `yaml:"rate_cap"`
	// BytesPerToken converts prompt bytes into tokens where a prompt is not tokenized (Tokens).
	// Default 4 (--bytes-per-token).
	BytesPerToken float64 `yaml:"bytes_per_token"`
}

// DefaultEstimateConfig returns the defaults (see each field).
func DefaultEstimateConfig() EstimateConfig {
	return EstimateConfig{PrefillRate: 8000, RateDecay: 0.01, RateSamples: 4, RateCap: 64, BytesPerToken: 4}
}

// WithDefaults returns c with its zero fields at their defaults.
func (c EstimateConfig) WithDefaults() EstimateConfig {
	d := DefaultEstimateConfig()
	orDefault(&c.PrefillRate, d.PrefillRate)
	orDefault(&c.RateDecay, d.RateDecay)
	orDefault(&c.RateSamples, d.RateSamples)
	orDefault(&c.RateCap, d.RateCap)
	orDefault(&c.BytesPerToken, d.BytesPerToken)
	return c
}

// orDefault sets *v to d where it is zero.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Validate reports the first invalid constant (after defaults). Each bound keeps a hostile or
// mistyped value from making the estimate meaningless.
func (c EstimateConfig) Validate() error {
	c = c.WithDefaults()
	for _, b := range [...]struct {
		ok  bool
		msg string
	}{
		{c.PrefillRate > 0 && c.PrefillRate <= 1e9, "prefill_rate must be in (0, 1e9] tokens/s"},
		{c.RateDecay >= 0 && c.RateDecay <= 1, "rate_decay must be in [0, 1]"},
		{c.RateSamples >= 0 && c.RateSamples <= 1000, "rate_samples must be in [0, 1000]"},
		{c.RateCap >= 1 && c.RateCap <= 1e6, "rate_cap must be in [1, 1e6]"},
		{c.BytesPerToken > 0 && c.BytesPerToken <= 64, "bytes_per_token must be in (0, 64]"},
	} {
		if !b.ok { // NaN fails every bound
			return errors.New(b.msg)
		}
	}
	return nil
}

// Tokens is the one rule that turns prompt bytes into tokens where a prompt is not tokenized:
// n ÷ BytesPerToken (the default where it is zero).
func (c *EstimateConfig) Tokens(n int64) float64 {
	bpt := c.BytesPerToken
	if bpt <= 0 {
		bpt = DefaultEstimateConfig().BytesPerToken
	}
	return float64(max(n, 0)) / bpt
}

// Estimate is one picture of one engine between its load reports: the last report, corrected
// by what every sender sent it and saw finish since. Routing's cost, flow control's saturation
// judgement and the fleet simulator all read an engine through it, so that they agree on its
// prefill rate, its requests, its KV usage and the tokens of a prompt.
//
//	prefill rate μ   the decaying peak of the prefill rates of busy poll intervals: the
//	                 engine's prefill counters, else its queued prefill's falls (Observe);
//	                 PrefillRate until RateSamples measured it
//	queued Q         the report's queued uncached prefill less μ × the report's age
//	sent S           the uncached prefill sent since the report: this replica's × the report's
//	                 replica estimate, or, once peers report theirs, the sum over replicas;
//	                 less what the engine prefilled past Q
//	requests         the report's running + waiting, plus what was sent less what finished since
//	                 (this replica's scaled as S is), never below this replica's in flight
//	KV usage         (the report's used tokens + the KV sent − the KV freed since) ÷ its capacity
//
// Inputs come through narrow methods: Observe (a newer report), Sent and Finished (a request
// sent or ended, by this replica or a peer), ObservePromptRate (a prompt's prefill rate from the
// engine's own Prometheus counters), ObserveQueueRate (a queue's rate measured elsewhere). The zero value knows nothing. Not safe for
// concurrent use: every owner holds its own lock around it.
type Estimate struct {
	polled time.Time
	// queued is the last report's Q, in tokens.
	queued float64
	// own and peer are what was sent and finished since the report.
	own, peer since
	// peers is true once a peer's send was recorded since the report.
	peers bool
	// rate is the measured μ, tokens/s, 0 until measured; rated counts the intervals that
	// measured it.
	rate  float64
	rated int
	// prompt is one prompt's prefill rate as the engine's own counters measure it (ObservePromptRate),
	// tokens/s; 0 unknown.
	prompt float64
	// busy is the last report's prefill-busy counters.
	busy Busy
	// slots is the running batch learned from reports with requests waiting; stated the one
	// the engine states (ObserveBatch), which wins while it is stated.
	slots, stated int64
}

// Busy is an engine's prefill-busy counters at a report (Report.Busy): the prompt tokens its
// prefill steps computed and those steps' seconds since it started; Counted is false where the
// engine reports none.
type Busy struct {
	Tokens, Seconds float64
	Counted         bool
}

// Busy returns r's prefill-busy counters.
func (r *Report) Busy() Busy {
	return Busy{Tokens: float64(r.PrefillBusyTokensTotal), Seconds: r.PrefillBusySecondsTotal, Counted: r.prefillBusyCounted}
}

// since is what one kind of sender sent an engine and saw finish since its report.
type since struct {
	// kv and freed are the prompt tokens of the requests sent and of those that finished (the KV
	// they take when admitted and free when they end); uncached the prefill the sends were
	// predicted to add; reqs the requests sent less those finished.
	kv, freed, uncached float64
	reqs                int64
}

// Polled returns when the report the estimate follows was polled; zero before one.
func (e *Estimate) Polled() time.Time { return e.polled }

// Follows reports whether the estimate follows the report polled at polled.
func (e *Estimate) Follows(polled time.Time) bool { return e.polled.Equal(polled) }

// Observe moves the estimate on to a report polled at polled with queued tokens of prefill (Q:
// the report's queued uncached prefill, or the caller's estimate of it where the engine reports
// request counts only), running and waiting requests, when it is newer than the one it follows;
// it reports whether it moved.
//
// busy is the engine's prefill-busy counters (Report.Busy). Where the engine counts them (SGLang's
// /v1/loads total_prefill_uncached_tokens and total_prefill_busy_us), an interval's rate is the
// tokens its prefill steps computed over those steps' seconds, once it prefilled for at least
// half the interval or had prefill queued throughout it (below): what the engine prefills in a
// second of prefill at the load it is under, which every replica reads alike. One such interval
// measures μ (RateSamples waits for falls, each only a bound): a half-speed engine priced at the
// default until four intervals fell took twice its share meanwhile (mixed speeds, 1 gateway:
// p99 3,063 → 2,693 ms).
//
// Without the counters, while the engine still has prefill queued at the end of an interval it
// was prefilling throughout, the fall of its backlog over the interval is a lower bound on its
// prefill rate whatever anyone sent it meanwhile (sends only make the fall smaller), and equals
// the rate over an interval in which nothing arrived; an interval counts only when it began with
// at least as much prefill queued as the current μ drains in it (a small backlog falls as far as
// it is long, however fast the engine is). But a queued prompt whose prefix the engine cached
// while it waited leaves the backlog without being prefilled: under overload, where a
// conversation's next turn queues behind its last, the falls read 20–55k tokens/s on engines
// that prefill 8k, and the cost piles work on the engines that hold caches. The counters count
// only what was computed.
//
// μ is the decaying peak of the intervals' rates, so it approaches each engine's true rate at
// every replica alike, and an engine that slows down is seen to. Adding what was sent since to
// the falls would be closer on average but is biased: a send that hits the engine's cache queues
// less than predicted, so the engines that hold more would look faster and attract more.
func (e *Estimate) Observe(polled time.Time, queued float64, running, waiting int64, busy Busy, cfg *EstimateConfig) bool {
	if !polled.After(e.polled) {
		return false
	}
	if dt := polled.Sub(e.polled).Seconds(); !e.polled.IsZero() && dt > 0 {
		sample, counted := 0.0, false
		queuedThroughout := queued > 0 && e.queued >= e.Rate(cfg)*dt
		switch dTok, dSec := busy.Tokens-e.busy.Tokens, busy.Seconds-e.busy.Seconds; {
		case busy.Counted && e.busy.Counted && dTok >= 0 && dSec > 0 && (queuedThroughout || dSec >= dt/2):
			sample, counted = dTok/dSec, true
		case queuedThroughout && e.queued > queued:
			sample = (e.queued - queued) / dt
		}
		if sample > 0 {
			e.rate = max(min(sample, cfg.RateCap*cfg.PrefillRate), e.rate*(1-cfg.RateDecay))
			e.rated++
			if counted { // the rate itself, where a fall is a bound: RateSamples waits for falls
				e.rated = max(e.rated, cfg.RateSamples)
			}
		}
	}
	e.polled, e.queued, e.busy = polled, queued, busy
	e.own, e.peer, e.peers = since{}, since{}, false
	switch {
	case waiting > 0 && running > 0:
		e.slots = running // full at its running count
	case running > e.slots && e.slots > 0:
		e.slots = running
	}
	return true
}

// ObservePromptRate records one prompt's prefill rate as the engine's own counters measure it
// (loadmon/prefillrate.go), in tokens/s: PromptRate from then on, and a floor of Rate (an engine
// drains its queue at least as fast as it prefills one prompt). A non-positive or non-finite
// rate is ignored; one above RateCap × PrefillRate counts as that.
func (e *Estimate) ObservePromptRate(tokensPerSecond float64, cfg *EstimateConfig) {
	if r, ok := boundRate(tokensPerSecond, cfg); ok {
		e.prompt = r
	}
}

// ObserveQueueRate sets μ, the rate the engine drains its queue at, to one measured elsewhere
// (tokens/s), as if RateSamples intervals had measured it: it replaces PrefillRate at once, and
// the backlog's falls move it on from there. Bounded as ObservePromptRate is.
func (e *Estimate) ObserveQueueRate(tokensPerSecond float64, cfg *EstimateConfig) {
	if r, ok := boundRate(tokensPerSecond, cfg); ok {
		e.rate, e.rated = r, max(e.rated, cfg.RateSamples)
	}
}

// boundRate returns a rate reported from outside the estimate, at most RateCap × PrefillRate; ok
// false for a non-positive or non-finite one.
func boundRate(tokensPerSecond float64, cfg *EstimateConfig) (float64, bool) {
	if !(tokensPerSecond > 0) || math.IsInf(tokensPerSecond, 0) {
		return 0, false
	}
	return min(tokensPerSecond, cfg.RateCap*cfg.PrefillRate), true
}

// PromptRate returns μp, the rate one prompt prefills at once the engine starts it, in tokens
// per second: the last rate ObservePromptRate recorded, else 0 (unknown: the prompt is priced at
// Rate). It differs from Rate on an engine that prefills several prompts at once, which drains
// its queue that many times faster than each prompt prefills (llm-d-inference-sim: 8 slots at
// 1 ms a token, μp 1,000 tokens/s, Rate about 8,000).
func (e *Estimate) PromptRate(cfg *EstimateConfig) float64 { return e.prompt }

// Sent records a request sent to the engine by origin since the report: kv prompt tokens, of
// which uncached were predicted to miss its cache.
func (e *Estimate) Sent(o Origin, kv, uncached float64) {
	s := e.of(o)
	s.kv += max(kv, 0)
	s.uncached += max(uncached, 0)
	s.reqs++
	if o == Peer {
		e.peers = true
	}
}

// Finished records the end of a request origin sent the engine (before or after the report),
// holding the kv tokens Sent was given.
func (e *Estimate) Finished(o Origin, kv float64) {
	s := e.of(o)
	s.freed += max(kv, 0)
	s.reqs--
}

func (e *Estimate) of(o Origin) *since {
	if o == Peer {
		return &e.peer
	}
	return &e.own
}

// Rate returns μ, the rate the engine drains its queued prefill at, in tokens per second:
// measured once RateSamples intervals measured it, else cfg.PrefillRate; never below PromptRate
// (an engine drains its queue at least as fast as it prefills one prompt).
func (e *Estimate) Rate(cfg *EstimateConfig) float64 {
	if e.rated >= cfg.RateSamples && e.rate > 0 {
		return max(e.rate, e.prompt)
	}
	return max(cfg.PrefillRate, e.prompt)
}

// Measured returns the measured μ, tokens/s, and the intervals that measured it; 0 before any.
func (e *Estimate) Measured() (rate float64, intervals int) { return e.rate, e.rated }

// scale is what this replica's share since the report is multiplied by: the report's replica
// estimate while no peer has said what it sent, 1 after (each replica's share is then known).
func (e *Estimate) scale(replicas float64) float64 {
	if e.peers {
		return 1
	}
	return max(replicas, 1)
}

// Prefill returns Q and S as of now, in tokens (see Estimate), replicas being the report's
// estimate of gateway replicas: what the engine had queued at the report less what it has
// prefilled since at μ, and what was sent since less what it prefilled past Q.
func (e *Estimate) Prefill(now time.Time, replicas float64, cfg *EstimateConfig) (queued, sent float64) {
	done := e.Rate(cfg) * max(now.Sub(e.polled).Seconds(), 0)
	sent = e.own.uncached*e.scale(replicas) + e.peer.uncached
	return max(e.queued-done, 0), max(sent-max(done-e.queued, 0), 0)
}

// Wait returns the predicted wait before a new request's prefill starts on the engine, in
// seconds: (Q + S) ÷ μ as of now.
func (e *Estimate) Wait(now time.Time, replicas float64, cfg *EstimateConfig) float64 {
	q, s := e.Prefill(now, replicas, cfg)
	return (q + s) / e.Rate(cfg)
}

// Requests returns the requests at the engine now: r's running and waiting, plus what was sent
// less what finished since (this replica's from its in-flight count local against r's, scaled
// as S is), never below local.
func (e *Estimate) Requests(r *Report, local int64) float64 {
	return e.RequestsAt(r.Backlog(), r.InflightAtPoll, r.Replicas, local)
}

// RequestsAt is Requests from the report's backlog (running + waiting), this replica's in-flight
// count at its poll and its replica estimate, for a caller that keeps no whole Report.
func (e *Estimate) RequestsAt(backlog, inflightAtPoll int64, replicas float64, local int64) float64 {
	own := e.scale(replicas) * float64(local-inflightAtPoll)
	return max(float64(local), float64(backlog)+own+float64(e.peer.reqs))
}

// KVUsage returns the engine's KV-cache usage now, in [0,1]: r's used tokens plus the KV sent
// less the KV freed since, over its capacity; r's own usage where it reports no capacity.
func (e *Estimate) KVUsage(r *Report) float64 {
	if r.MaxTokens <= 0 {
		return r.TokenUsage
	}
	used := float64(r.UsedTokens)
	if used == 0 {
		used = r.TokenUsage * float64(r.MaxTokens)
	}
	delta := e.own.kv - e.own.freed + e.peer.kv - e.peer.freed
	return min(max((used+delta)/float64(r.MaxTokens), 0), 1)
}

// MaxSlots bounds the running batch an engine may state (ObserveBatch): a larger statement is
// taken as this many, so that a hostile or mistaken report cannot make one engine look able to
// take every queued request at once.
const MaxSlots = 65536

// ObserveBatch records the running batch the engine states in its report: the most requests it
// runs at once (max_running_requests, summed over its ranks; Report.MaxRunning), capped at
// MaxSlots. A report that states none (0) leaves the batch to what the running and waiting
// counts show, as before any statement.
func (e *Estimate) ObserveBatch(maxRunning int64) {
	e.stated = min(max(maxRunning, 0), MaxSlots)
}

// Slots returns the engine's running batch: the one it states (ObserveBatch), else as its
// reports show it (the running count of a report with requests waiting, or more running
// since); 0 while unknown.
func (e *Estimate) Slots() int64 {
	if e.stated > 0 {
		return e.stated
	}
	return e.slots
}

// SlotsStated reports whether Slots is the batch the engine states, rather than one its reports
// showed full or none.
func (e *Estimate) SlotsStated() bool { return e.stated > 0 }
