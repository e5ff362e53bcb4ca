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

// rankLoad is one data-parallel rank's entry of a /v1/loads body. Counts are read as float64 so
// that a server writing 3.0 for 3 is still understood; the has* flags mark the token fields whose
// presence matters (a JSON null clears them, as it would a pointer).
type rankLoad struct {
	running, waiting, uncached, used, maxTokens  float64
	usage, throughput, hitRate                   float64
	hasUncached, hasUsage, hasThroughput, hasHit bool
}

// loadsAcc folds ranks into a Report: counts and throughput summed, ratios averaged.
type loadsAcc struct {
	r            Report
	usage, hit   float64
	nUsage, nHit int
}

func (a *loadsAcc) add(l *rankLoad) {
	r := &a.r
	r.Running = satAdd(r.Running, clampCount(l.running))
	r.Waiting = satAdd(r.Waiting, clampCount(l.waiting))
	r.MaxTokens = satAdd(r.MaxTokens, clampCount(l.maxTokens))
	r.UsedTokens = satAdd(r.UsedTokens, clampCount(l.used))
	if l.hasUncached {
		r.WaitingUncachedTokens = satAdd(r.WaitingUncachedTokens, clampCount(l.uncached))
		r.HasTokenData, r.HasUncachedTokens = true, true
	}
	if l.hasUsage {
		a.usage += clampRatio(l.usage)
		a.nUsage++
		r.HasTokenData = true
	}
	if l.hasThroughput {
		r.GenThroughput = clampRate(r.GenThroughput + clampRate(l.throughput))
		r.HasTokenData = true
	}
	if l.hasHit {
		a.hit += clampRatio(l.hitRate)
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
				var l rankLoad
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
func rankField(s *jsonscan.Scanner, l *rankLoad, key []byte) {
	var dst *float64
	var has *bool
	switch {
	case keyIs(key, "num_running_reqs"):
		dst = &l.running
	case keyIs(key, "num_waiting_reqs"):
		dst = &l.waiting
	case keyIs(key, "num_waiting_uncached_tokens"):
		dst, has = &l.uncached, &l.hasUncached
	case keyIs(key, "num_used_tokens"):
		dst = &l.used
	case keyIs(key, "max_total_num_tokens"):
		dst = &l.maxTokens
	case keyIs(key, "token_usage"):
		dst, has = &l.usage, &l.hasUsage
	case keyIs(key, "gen_throughput"):
		dst, has = &l.throughput, &l.hasThroughput
	case keyIs(key, "cache_hit_rate"):
		dst, has = &l.hitRate, &l.hasHit
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
