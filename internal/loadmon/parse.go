package loadmon

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvgate/kvgate/internal/jsonscan"
)

// ErrNoLoadData is returned by the parsers for a well-formed body that carries no load report
// (a /v1/loads body without "loads", a /metrics body without the backlog metrics).
var ErrNoLoadData = errors.New("no load data")

// Bounds applied to reported values, so that a buggy or hostile worker cannot overflow the int64
// sums or poison the float arithmetic of the policies.
const (
	maxCount      = 1 << 40 // per rank or per label set
	maxThroughput = 1e12    // tokens per second
)

// clampCount converts a reported count to int64: rounded, NaN and negatives to 0, capped.
func clampCount(v float64) int64 {
	switch {
	case !(v > 0): // also NaN
		return 0
	case v >= maxCount:
		return maxCount
	}
	return int64(math.Round(v))
}

// clampRatio maps a reported ratio into [0,1], NaN to 0.
func clampRatio(v float64) float64 {
	switch {
	case !(v > 0):
		return 0
	case v > 1:
		return 1
	}
	return v
}

// clampRate maps a reported rate into [0, maxThroughput], NaN to 0.
func clampRate(v float64) float64 {
	switch {
	case !(v > 0):
		return 0
	case v > maxThroughput:
		return maxThroughput
	}
	return v
}

// Rank is one data-parallel rank's entry of a native /v1/loads body. Counts are float64 so that
// a server writing 3.0 for 3 is still understood; the Has flags mark the token fields whose
// presence matters (absent, or a JSON null, leaves them false). ParseLoads reads a body into
// Ranks, and the fleet simulator builds them from its engines: both then fold them with
// ReportOf, so that a simulated gateway sees exactly what a real one would.
type Rank struct {
	Running, Waiting, WaitingUncachedTokens, UsedTokens, MaxTokens, MaxRunning float64
	TokenUsage, GenThroughput, CacheHitRate                                    float64
	// PrefillBusyTokens and PrefillBusyMicros are SGLang's total_prefill_uncached_tokens and
	// total_prefill_busy_us: the prompt tokens its prefill steps computed and those steps' time.
	PrefillBusyTokens, PrefillBusyMicros                      float64
	HasUncached, HasUsage, HasThroughput, HasHitRate, HasBusy bool
}

// ReportOf folds ranks into a Report as ParseLoads does: counts and throughput summed, ratios
// averaged over the ranks that report them, every value clamped. PolledAt, InflightAtPoll and
// Replicas are left zero for the caller.
func ReportOf(ranks ...Rank) Report {
	var acc loadsAcc
	for i := range ranks {
		acc.add(&ranks[i])
	}
	return acc.report()
}

// loadsAcc folds ranks into a Report: counts and throughput summed, ratios averaged.
type loadsAcc struct {
	r                   Report
	usage, hit          float64
	nUsage, nHit, nBusy int
}

func (a *loadsAcc) add(l *Rank) {
	r := &a.r
	r.Running = satAdd(r.Running, clampCount(l.Running))
	r.Waiting = satAdd(r.Waiting, clampCount(l.Waiting))
	r.MaxTokens = satAdd(r.MaxTokens, clampCount(l.MaxTokens))
	r.UsedTokens = satAdd(r.UsedTokens, clampCount(l.UsedTokens))
	r.MaxRunning = satAdd(r.MaxRunning, clampCount(l.MaxRunning))
	if l.HasUncached {
		r.WaitingUncachedTokens = satAdd(r.WaitingUncachedTokens, clampCount(l.WaitingUncachedTokens))
		r.HasTokenData, r.HasUncachedTokens = true, true
	}
	if l.HasUsage {
		a.usage += clampRatio(l.TokenUsage)
		a.nUsage++
		r.HasTokenData = true
	}
	if l.HasThroughput {
		r.GenThroughput = clampRate(r.GenThroughput + clampRate(l.GenThroughput))
		r.HasTokenData = true
	}
	if l.HasBusy {
		r.PrefillBusyTokensTotal = satAdd(r.PrefillBusyTokensTotal, clampCount(l.PrefillBusyTokens))
		r.PrefillBusySecondsTotal = min(r.PrefillBusySecondsTotal+max(l.PrefillBusyMicros, 0)/1e6, maxPrefillSeconds)
		r.prefillBusyCounted = true
		a.nBusy++
	}
	if l.HasHitRate {
		a.hit += clampRatio(l.CacheHitRate)
		a.nHit++
	}
}

func (a *loadsAcc) report() Report {
	r := a.r
	if a.nUsage > 0 {
		r.TokenUsage = a.usage / float64(a.nUsage)
	}
	if a.nHit > 0 {
		r.CacheHitRate = a.hit / float64(a.nHit)
	}
	if a.nBusy > 1 {
		// Ranks prefill side by side: the worker's tokens are the ranks' sum, its seconds their
		// mean, so that the ratio is the worker's rate (the ranks' rates summed, for ranks about
		// equally busy), the rate its summed queue drains at.
		r.PrefillBusySecondsTotal /= float64(a.nBusy)
	}
	return r
}

// ParseLoads parses a native /v1/loads body. Counts and throughput are summed over the
// data-parallel ranks (throughput is the worker's total); token_usage and cache_hit_rate are
// averaged over the ranks that report them. HasTokenData is set when any rank reports
// gen_throughput, token_usage or num_waiting_uncached_tokens. A body without a "loads" array
// fails with ErrNoLoadData; an empty array is an idle worker. PolledAt and InflightAtPoll are
// left zero for the caller.
//
// It accepts exactly what encoding/json would decode into the documented struct (keys matched
// case-insensitively, the last duplicate winning, null a no-op), which the fuzz tests check
// against encoding/json itself, but it builds nothing and allocates nothing on success.
func ParseLoads(body []byte) (Report, error) {
	s := jsonscan.New(body)
	var (
		acc      loadsAcc
		hasLoads bool
	)
	s.Document(func() {
		if s.Null() {
			return
		}
		s.Object(func(key []byte) {
			if !keyIs(key, "loads") {
				s.Skip()
				return
			}
			if s.Null() {
				acc, hasLoads = loadsAcc{}, false
				return
			}
			acc, hasLoads = loadsAcc{}, true
			s.Array(func() {
				var l Rank
				if !s.Null() {
					s.Object(func(key []byte) { rankField(s, &l, key) })
				}
				acc.add(&l)
			})
		})
	})
	switch {
	case s.Err() != nil:
		return Report{}, fmt.Errorf("parse /v1/loads: %w", s.Err())
	case !hasLoads:
		return Report{}, fmt.Errorf("parse /v1/loads: %w", ErrNoLoadData)
	}
	return acc.report(), nil
}

// keyIs matches JSON keys and HTTP header names as encoding/json and net/textproto do.
var keyIs = jsonscan.KeyIs

// rankField reads the value of key into l.
func rankField(s *jsonscan.Scanner, l *Rank, key []byte) {
	var dst *float64
	var has *bool
	switch {
	case keyIs(key, "num_running_reqs"):
		dst = &l.Running
	case keyIs(key, "num_waiting_reqs"):
		dst = &l.Waiting
	case keyIs(key, "num_waiting_uncached_tokens"):
		dst, has = &l.WaitingUncachedTokens, &l.HasUncached
	case keyIs(key, "num_used_tokens"):
		dst = &l.UsedTokens
	case keyIs(key, "max_total_num_tokens"):
		dst = &l.MaxTokens
	case keyIs(key, "max_running_requests"):
		dst = &l.MaxRunning
	case keyIs(key, "token_usage"):
		dst, has = &l.TokenUsage, &l.HasUsage
	case keyIs(key, "gen_throughput"):
		dst, has = &l.GenThroughput, &l.HasThroughput
	case keyIs(key, "cache_hit_rate"):
		dst, has = &l.CacheHitRate, &l.HasHitRate
	case keyIs(key, "total_prefill_uncached_tokens"):
		dst = &l.PrefillBusyTokens
	case keyIs(key, "total_prefill_busy_us"):
		dst, has = &l.PrefillBusyMicros, &l.HasBusy
	default:
		s.Skip()
		return
	}
	if s.Null() {
		if has != nil {
			*dst, *has = 0, false
		}
		return
	}
	if v, ok := s.Number(true); ok {
		*dst = v
		if has != nil {
			*has = true
		}
	}
}
