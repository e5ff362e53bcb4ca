// Package loadmon polls every worker for the load it reports itself (native /v1/loads or
// Prometheus /metrics), publishes the results as immutable snapshots, and computes each worker's
// effective load: the reported backlog corrected for what this gateway sent since the poll.
package loadmon

import (
	"math"
	"time"
)

// Report is one worker's load as it reported it at one poll. Counts are summed over data-parallel
// ranks (in int64); ratios are averaged. Absent fields are zero.
type Report struct {
	// Running is the number of requests the worker is running.
	Running int64 `json:"num_running_reqs"`
	// Waiting is the number of requests queued at the worker.
	Waiting int64 `json:"num_waiting_reqs"`
	// WaitingUncachedTokens is the prompt tokens of queued requests that miss the prefix cache.
	WaitingUncachedTokens int64 `json:"num_waiting_uncached_tokens"`
	// UsedTokens is the KV cache's used token capacity.
	UsedTokens int64 `json:"num_used_tokens"`
	// MaxTokens is the KV cache's total token capacity.
	MaxTokens int64 `json:"max_total_num_tokens"`
	// MaxRunning is the most requests the worker runs at once (max_running_requests, summed
	// over ranks); zero when not reported.
	MaxRunning int64 `json:"max_running_requests,omitempty"`
	// TokenUsage is KV-cache usage in [0,1].
	TokenUsage float64 `json:"token_usage"`
	// GenThroughput is generated tokens per second.
	GenThroughput float64 `json:"gen_throughput"`
	// GenTokensTotal is the worker's cumulative generated tokens (vLLM's
	// generation_tokens_total counter); zero when not reported. The Monitor turns its growth
	// between two polls into GenThroughput for runtimes that report no throughput gauge.
	GenTokensTotal int64 `json:"generation_tokens_total,omitempty"`
	// PromptTokensTotal, PrefixQueryTokensTotal, PrefixHitTokensTotal and PrefillSecondsTotal
	// are vLLM's cumulative prompt tokens (prompt_tokens_total), prompt tokens looked up in the
	// prefix cache (prefix_cache_queries_total), those served from it (prefix_cache_hits_total)
	// and seconds its requests spent in prefill (request_prefill_time_seconds_sum); zero when not
	// reported. The Monitor turns their growth between two polls into PrefillRate
	// (prefillrate.go).
	PromptTokensTotal      int64   `json:"prompt_tokens_total,omitempty"`
	PrefixQueryTokensTotal int64   `json:"prefix_cache_queries_total,omitempty"`
	PrefixHitTokensTotal   int64   `json:"prefix_cache_hits_total,omitempty"`
	PrefillSecondsTotal    float64 `json:"prefill_seconds_total,omitempty"`
	// PrefillBusyTokensTotal and PrefillBusySecondsTotal are SGLang's cumulative prompt tokens
	// computed by its prefill steps and those steps' time (/v1/loads
	// total_prefill_uncached_tokens, total_prefill_busy_us): the tokens summed over the
	// data-parallel ranks, the seconds their mean; zero when not reported. Their growth between
	// two polls is the rate the engine drains its queue at (Estimate.Observe).
	PrefillBusyTokensTotal  int64   `json:"total_prefill_uncached_tokens,omitempty"`
	PrefillBusySecondsTotal float64 `json:"prefill_busy_seconds_total,omitempty"`
	// prefillBusyCounted is set when the report had total_prefill_busy_us, zero or not.
	prefillBusyCounted bool
	// PrefillRate is the engine's prefill rate read from its own counters, in uncached prompt
	// tokens per second a request spends in prefill; zero when unknown (the cost then measures
	// μ from the backlog's falls, or takes --prefill-rate).
	PrefillRate float64 `json:"prefill_rate,omitempty"`
	// prefillCounted is set when the page had the prompt-token counter, zero or not.
	prefillCounted bool
	// CacheHitRate is the prefix-cache hit rate in [0,1].
	CacheHitRate float64 `json:"cache_hit_rate"`
	// HasTokenData is true when the source reported token-level fields (usage, throughput).
	HasTokenData bool `json:"has_token_data"`
	// HasUncachedTokens is true when WaitingUncachedTokens was reported (native /v1/loads), so
	// that a zero means "nothing to prefill" rather than "unknown".
	HasUncachedTokens bool `json:"has_uncached_tokens"`

	// LoRA is the worker's adapter state (vLLM's lora_requests_info; lora.go); nil when not
	// reported. Never changed once the report is made (a pointer keeps Report comparable).
	LoRA *LoRA `json:"lora,omitempty"`

	// PolledAt is when the poll was sent.
	PolledAt time.Time `json:"polled_at"`
	// InflightAtPoll is this gateway's in-flight count for the worker when the poll was sent.
	InflightAtPoll int64 `json:"inflight_at_poll"`
	// Replicas is the number of gateway replicas estimated from the poll round this report
	// belongs to (EstimateReplicas); ModeScaled reads it. Zero means unknown, taken as 1.
	Replicas float64 `json:"replicas_estimate"`
}

// Backlog is the reported running plus waiting requests (the snapshot backlog of the global-load formula), summed
// in int64 and saturating rather than wrapping.
func (r *Report) Backlog() int64 { return satAdd(r.Running, r.Waiting) }

// satAdd returns a+b, saturating at the int64 bounds instead of wrapping.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}
