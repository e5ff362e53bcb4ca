package loadmon

import (
	"cmp"
	"time"
)

// An engine's prefill rate from its own counters. vLLM (and llm-d-inference-sim) count the
// prompt tokens looked up in the prefix cache (prefix_cache_queries_total; where a page lacks it,
// the prompt tokens, prompt_tokens_total), those served from it (prefix_cache_hits_total) and the
// seconds requests spent in prefill (request_prefill_time_seconds, a histogram whose _sum grows
// by each request's prefill time). Between two polls,
//
//	μ = Δ(prefix-cache queries − prefix-cache hits) ÷ Δ(prefill seconds)
//
// in uncached tokens per second of a request's prefill: the rate at which a prompt of P − Ĉ
// uncached tokens gets its first token once the engine starts it, which is what the cost
// divides by. Every replica reads the same counters, so all of them see one μ. Engines that
// prefill several prompts at once in one batch count each prompt's whole wall time, so this
// is each prompt's rate, not the batch's.
//
// The uncached tokens are the queries' growth less the hits', not the prompt tokens': both cache
// counters move when a prompt is looked up, while an engine may count its prompt tokens when it
// finishes (llm-d-inference-sim does). Where most of each prompt is a hit the uncached tokens are
// a small difference of two large counters, which one long prompt counted on either side of a
// poll swamps: live, four identical engines read 935 to 36,600 tokens/s that way (true 1,000).
//
// One interval's two differences need not describe the same requests: an engine may count a
// prompt's tokens when it arrives and its prefill time when its first token leaves, so an
// interval with a burst of arrivals reads many tokens over little time. The rate is therefore
// the ratio of the two differences' sums over the last intervals, each older interval weighing
// rateKeep times the next (about 1 ÷ (1 − rateKeep) = 8 intervals): live on llm-d-inference-sim
// one interval's ratio read 10,941 tokens/s on one engine of four at 1 ms a token, and that
// engine took every miss.

// maxPrefillSeconds bounds a reported prefill-time total (about 300 years): a hostile counter
// cannot overflow the difference.
const maxPrefillSeconds = 1e10

// minPrefillSeconds is the least growth of the prefill-time total, in seconds, over which μ is
// measured: less is one short prompt's prefill, whose overhead dominates its rate.
const minPrefillSeconds = 0.05

// rateKeep is how much of the sums of earlier intervals the next interval keeps (see above).
const rateKeep = 0.875

// PrefillCounters is what one engine's previous poll's counters were, and the decayed sums of
// their growth: each poller keeps one per engine (the load monitor, and each of the fleet
// simulator's gateways). The zero value has seen no poll.
type PrefillCounters struct {
	uncached int64 // prompt tokens less prefix-cache hits
	seconds  float64
	at       time.Time
	// tok and sec are the decayed sums of the uncached tokens' and the prefill seconds' growth.
	tok, sec float64
}

// Derive sets r.PrefillRate from the counters' growth over the last intervals (see above), and
// keeps r's counters for the next. The first poll, a counter that went back (a restarted
// engine) and polls more than maxGap apart give no rate and start the sums again; so does less
// than minPrefillSeconds of prefill in the sums.
func (c *PrefillCounters) Derive(r *Report, maxGap time.Duration) {
	// Every poll is kept, with the counters at 0 where the page lacked them: a labelled
	// counter appears only once it counted something, so an idle engine's page has none.
	prev := *c
	c.uncached = max(cmp.Or(r.PrefixQueryTokensTotal, r.PromptTokensTotal)-r.PrefixHitTokensTotal, 0)
	c.seconds, c.at = r.PrefillSecondsTotal, r.PolledAt
	dTok, dSec := c.uncached-prev.uncached, c.seconds-prev.seconds
	if !r.prefillCounted || prev.at.IsZero() || r.PolledAt.Sub(prev.at) > maxGap || r.PolledAt.Sub(prev.at) <= 0 ||
		dTok < 0 || dSec < 0 {
		c.tok, c.sec = 0, 0 // a first poll, a gap or a restarted engine: start again
		return
	}
	c.tok = c.tok*rateKeep + float64(dTok)
	c.sec = c.sec*rateKeep + dSec
	if c.tok <= 0 || c.sec < minPrefillSeconds {
		return
	}
	r.PrefillRate = clampRate(c.tok / c.sec)
}

// SetPrefillCounters sets r's prefill counters (see Report.PromptTokensTotal), for a report that
// is not parsed from a page (the fleet simulator's engines), and marks them counted.
func (r *Report) SetPrefillCounters(promptTokens, prefixHitTokens int64, prefillSeconds float64) {
	r.PromptTokensTotal, r.PrefixHitTokensTotal = max(promptTokens, 0), max(prefixHitTokens, 0)
	r.PrefillSecondsTotal = min(max(prefillSeconds, 0), maxPrefillSeconds)
	r.prefillCounted = true
}
