package loadmon

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// loadsBody is the native GET /v1/loads?include=core body (DESIGN.md §2). Counts are decoded as
// float64 so that a server writing 3.0 for 3 is still understood; pointers mark the token fields
// whose presence matters.
type loadsBody struct {
	Loads *[]rankLoad `json:"loads"`
}

type rankLoad struct {
	Running         float64  `json:"num_running_reqs"`
	Waiting         float64  `json:"num_waiting_reqs"`
	WaitingUncached *float64 `json:"num_waiting_uncached_tokens"`
	UsedTokens      float64  `json:"num_used_tokens"`
	MaxTokens       float64  `json:"max_total_num_tokens"`
	TokenUsage      *float64 `json:"token_usage"`
	GenThroughput   *float64 `json:"gen_throughput"`
	CacheHitRate    *float64 `json:"cache_hit_rate"`
}

// ParseLoads parses a native /v1/loads body. Counts and throughput are summed over the
// data-parallel ranks (throughput is the worker's total); token_usage and cache_hit_rate are
// averaged over the ranks that report them. HasTokenData is set when any rank reports
// gen_throughput, token_usage or num_waiting_uncached_tokens. A body without a "loads" array
// fails with ErrNoLoadData; an empty array is an idle worker. PolledAt and InflightAtPoll are
// left zero for the caller.
func ParseLoads(body []byte) (Report, error) {
	var b loadsBody
	if err := json.Unmarshal(body, &b); err != nil {
		return Report{}, fmt.Errorf("parse /v1/loads: %w", err)
	}
	if b.Loads == nil {
		return Report{}, fmt.Errorf("parse /v1/loads: %w", ErrNoLoadData)
	}
	var (
		r                   Report
		usage, hit          float64
		nUsage, nHit        int
		uncached, usedTotal int64
	)
	for _, l := range *b.Loads {
		r.Running = satAdd(r.Running, clampCount(l.Running))
		r.Waiting = satAdd(r.Waiting, clampCount(l.Waiting))
		r.MaxTokens = satAdd(r.MaxTokens, clampCount(l.MaxTokens))
		usedTotal = satAdd(usedTotal, clampCount(l.UsedTokens))
		if l.WaitingUncached != nil {
			uncached = satAdd(uncached, clampCount(*l.WaitingUncached))
			r.HasTokenData = true
		}
		if l.TokenUsage != nil {
			usage += clampRatio(*l.TokenUsage)
			nUsage++
			r.HasTokenData = true
		}
		if l.GenThroughput != nil {
			r.GenThroughput = clampRate(r.GenThroughput + clampRate(*l.GenThroughput))
			r.HasTokenData = true
		}
		if l.CacheHitRate != nil {
			hit += clampRatio(*l.CacheHitRate)
			nHit++
		}
	}
	r.WaitingUncachedTokens, r.UsedTokens = uncached, usedTotal
	if nUsage > 0 {
		r.TokenUsage = usage / float64(nUsage)
	}
	if nHit > 0 {
		r.CacheHitRate = hit / float64(nHit)
	}
	return r, nil
}
