package sim

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ttftBuckets are vLLM's time-to-first-token histogram buckets, in seconds.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// histogram is a Prometheus histogram; the caller synchronizes.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative
	count  uint64
	sum    float64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
}

func (h *histogram) observe(v float64) {
	h.count++
	h.sum += v
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// write writes h in the text exposition format.
func (h *histogram) write(sb *strings.Builder, name, labels string) {
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(sb, "%s_bucket{%s,le=\"%s\"} %d\n", name, labels, formatFloat(b), cum)
	}
	fmt.Fprintf(sb, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, labels, h.count)
	fmt.Fprintf(sb, "%s_sum{%s} %s\n", name, labels, formatFloat(h.sum))
	fmt.Fprintf(sb, "%s_count{%s} %d\n", name, labels, h.count)
}

func formatFloat(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// loadsBody is the native /v1/loads answer (SGLang's /v1/loads?include=core).
type loadsBody struct {
	Timestamp   string     `json:"timestamp"`
	DPRankCount int        `json:"dp_rank_count"`
	Loads       []rankLoad `json:"loads"`
}

type rankLoad struct {
	DPRank                int     `json:"dp_rank"`
	NumRunningReqs        int     `json:"num_running_reqs"`
	NumWaitingReqs        int     `json:"num_waiting_reqs"`
	NumWaitingUncachedTok int64   `json:"num_waiting_uncached_tokens"`
	NumTotalReqs          int     `json:"num_total_reqs"`
	NumUsedTokens         int64   `json:"num_used_tokens"`
	MaxTotalNumTokens     int64   `json:"max_total_num_tokens"`
	TokenUsage            float64 `json:"token_usage"`
	GenThroughput         float64 `json:"gen_throughput"`
	CacheHitRate          float64 `json:"cache_hit_rate"`
	Utilization           float64 `json:"utilization"`
	MaxRunningRequests    int     `json:"max_running_requests"`
	// The prompt tokens the prefill steps computed and those steps' time, since start (SGLang's
	// cumulative counters; engine.Load.PrefillBusyTokens).
	TotalPrefillUncachedTok int64 `json:"total_prefill_uncached_tokens"`
	TotalPrefillBusyUs      int64 `json:"total_prefill_busy_us"`
}

func (s *Server) handleLoads(w http.ResponseWriter, _ *http.Request) {
	l := s.Load()
	writeJSON(w, loadsBody{
		Timestamp:   time.Now().UTC().Format(time.RFC3339Nano),
		DPRankCount: 1,
		Loads: []rankLoad{{
			NumRunningReqs: l.Running, NumWaitingReqs: l.Waiting,
			NumWaitingUncachedTok: l.PrefillTokens, // the prefill backlog, as in fleet's rankOf
			NumTotalReqs:          l.Running + l.Waiting,
			NumUsedTokens:         l.UsedTokens, MaxTotalNumTokens: l.MaxTokens, TokenUsage: l.TokenUsage,
			GenThroughput: l.GenThroughput, CacheHitRate: l.CacheHitRate, Utilization: l.TokenUsage,
			MaxRunningRequests:      l.MaxRunning,
			TotalPrefillUncachedTok: l.PrefillBusyTokens, TotalPrefillBusyUs: int64(l.PrefillBusySeconds * 1e6),
		}},
	})
}

// handleMetrics writes the flavor's Prometheus metrics, under the names the real servers use.
func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.syncLocked()
	l := s.eng.Load()
	lora := s.eng.Lora()
	hist := s.ttft
	hist.counts = append([]uint64(nil), s.ttft.counts...)
	s.mu.Unlock()

	labels := fmt.Sprintf("model_name=%q", s.cfg.Model)
	var sb strings.Builder
	metric := func(name, typ, help string, v float64) {
		fmt.Fprintf(&sb, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %s\n", name, help, name, typ, name, labels, formatFloat(v))
	}
	p := "sglang:"
	if s.cfg.Flavor == FlavorVLLM {
		p = "vllm:"
		metric(p+"num_requests_running", "gauge", "Number of requests in model execution batches.", float64(l.Running))
		metric(p+"num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(l.Waiting))
		metric(p+"kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l.TokenUsage)
		metric(p+"prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.", float64(l.PromptTokens))
		metric(p+"prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", float64(l.CachedTokens))
		metric(p+"prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(l.PromptTokens))
		metric(p+"generation_tokens_total", "counter", "Number of generation tokens processed.", float64(l.GeneratedTokens))
		metric(p+"num_preemptions_total", "counter", "Cumulative number of preemptions.", float64(l.Preemptions))
		if prefilled := l.PrefilledRequests; prefilled > 0 { // a labelled histogram appears once observed, as vLLM's does
			name := p + "request_prefill_time_seconds"
			fmt.Fprintf(&sb, "# HELP %s Histogram of time spent in PREFILL phase for request.\n# TYPE %s histogram\n", name, name)
			fmt.Fprintf(&sb, "%s_bucket{%s,le=\"+Inf\"} %d\n%s_sum{%s} %s\n%s_count{%s} %d\n",
				name, labels, prefilled, name, labels, formatFloat(l.PrefillSeconds), name, labels, prefilled)
		}
		if lora.MaxLoras > 0 || len(s.cfg.LoraModules) > 0 {
			writeLoraMetric(&sb, lora, time.Now())
		}
	} else {
		metric(p+"num_running_reqs", "gauge", "The number of running requests.", float64(l.Running))
		metric(p+"num_queue_reqs", "gauge", "The number of requests in the waiting queue.", float64(l.Waiting))
		metric(p+"num_used_tokens", "gauge", "The number of used tokens.", float64(l.UsedTokens))
		metric(p+"token_usage", "gauge", "The token usage.", l.TokenUsage)
		metric(p+"gen_throughput", "gauge", "The generation throughput (token/s).", l.GenThroughput)
		metric(p+"cache_hit_rate", "gauge", "The prefix cache hit rate.", l.CacheHitRate)
		metric(p+"prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(l.PromptTokens))
		metric(p+"generation_tokens_total", "counter", "Number of generation tokens processed.", float64(l.GeneratedTokens))
	}
	name := p + "time_to_first_token_seconds"
	fmt.Fprintf(&sb, "# HELP %s Histogram of time to first token in seconds.\n# TYPE %s histogram\n", name, name)
	hist.write(&sb, name, labels)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(sb.String()))
}
