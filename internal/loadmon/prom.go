package loadmon

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// Runtime names, as registered (--worker-runtime, the "runtime" label) or learned from /v1/models
// owned_by.
const (
	RuntimeSGLang = "sglang"
	RuntimeVLLM   = "vllm"
)

// promField is the Report field one Prometheus metric feeds.
type promField uint8

const (
	fNone         promField = iota
	fRunning                // vllm:num_requests_running, sglang num_running_reqs
	fWaiting                // vllm:num_requests_waiting, sglang num_queue_reqs
	fUsage                  // vllm:kv_cache_usage_perc, sglang token_usage
	fUsageOld               // vllm:gpu_cache_usage_perc (vLLM before kv_cache_usage_perc)
	fHits                   // vllm:prefix_cache_hits_total
	fQueries                // vllm:prefix_cache_queries_total
	fThroughput             // sglang gen_throughput
	fHitRate                // sglang cache_hit_rate
	fUsedTokens             // sglang num_used_tokens
	fGenTokens              // vllm:generation_tokens_total
	fLoRA                   // vllm:lora_requests_info (labels read by lora.go)
	fPromptTokens           // vllm:prompt_tokens_total
	fPrefillSecs            // vllm:request_prefill_time_seconds_sum
	nPromFields
)

// promName is one metric name a runtime's field reads, after its runtime prefix.
type promName struct {
	name string
	f    promField
}

// promNames holds the names read after one runtime prefix, by their first byte.
type promNames [256][]promName

// byFirstByte indexes names by their first byte.
func byFirstByte(names ...promName) *promNames {
	var t promNames
	for _, n := range names {
		t[n.name[0]] = append(t[n.name[0]], n)
	}
	return &t
}

// vllmNames follow the "vllm:" prefix; sglangNames follow "sglang:" (SGLang ≤ 0.5.3) or
// "sglang_" (newer).
var (
	vllmNames = byFirstByte(
		promName{"num_requests_running", fRunning}, promName{"num_requests_waiting", fWaiting},
		promName{"kv_cache_usage_perc", fUsage}, promName{"gpu_cache_usage_perc", fUsageOld},
		promName{"prefix_cache_hits_total", fHits}, promName{"prefix_cache_queries_total", fQueries},
		promName{"generation_tokens_total", fGenTokens}, promName{"lora_requests_info", fLoRA},
		promName{"prompt_tokens_total", fPromptTokens}, promName{"request_prefill_time_seconds_sum", fPrefillSecs},
	)
	sglangNames = byFirstByte(
		promName{"num_running_reqs", fRunning}, promName{"num_queue_reqs", fWaiting}, promName{"token_usage", fUsage},
		promName{"gen_throughput", fThroughput}, promName{"cache_hit_rate", fHitRate}, promName{"num_used_tokens", fUsedTokens},
	)
)

// promFieldOf maps a metric name to the field it feeds; runtime "vllm" or "sglang" restricts the
// names to that runtime's, anything else accepts both.
func promFieldOf(name []byte, runtime string) promField {
	if f, n := promFieldAt(name, runtime); n == len(name) {
		return f
	}
	return fNone
}

// promFieldAt returns the field fed by the metric whose name starts b, and the name's length; fNone
// when the name feeds none. It compares b with the one or two names a runtime reads that start
// with the byte after b's prefix, instead of scanning the name first: most lines of a vLLM
// /metrics page are histogram buckets, whose names match none.
func promFieldAt(b []byte, runtime string) (promField, int) {
	var names *promNames
	var p int
	switch {
	case len(b) > 5 && b[0] == 'v' && runtime != RuntimeSGLang && string(b[:5]) == "vllm:":
		names, p = vllmNames, 5
	case len(b) > 7 && b[0] == 's' && runtime != RuntimeVLLM && string(b[:6]) == "sglang" && (b[6] == ':' || b[6] == '_'):
		names, p = sglangNames, 7
	default:
		return fNone, 0
	}
	rest := b[p:]
	for _, c := range names[rest[0]] {
		n := len(c.name)
		if len(rest) >= n && string(rest[:n]) == c.name && (len(rest) == n || !isNameByte(rest[n], false)) {
			return c.f, p + n
		}
	}
	return fNone, 0
}

// ParsePrometheus parses a Prometheus text-format /metrics body (OpenMetrics text is accepted too)
// into a Report. runtime "vllm" or "sglang" restricts the metric names to that runtime's (both
// SGLang prefixes, both vLLM KV-usage names); "" accepts either. Counts and throughput are summed
// over label sets (in int64 for counts); ratios are averaged; vLLM's prefix hit rate is
// hits_total / queries_total. HasTokenData is set when gen_throughput is present; vLLM has no
// such gauge, but its generation_tokens_total counter goes to GenTokensTotal, from which the
// Monitor derives GenThroughput between two polls.
//
// Only the lines of the metrics above are parsed, in one pass with no allocation for the lines
// skipped; a malformed line of one of them fails the body, other lines are ignored. A body
// without both a running and a waiting metric fails with ErrNoLoadData.
func ParsePrometheus(body []byte, runtime string) (Report, error) {
	var (
		s      promSums
		lineNo int
	)
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		lineNo++
		f, v, ok := parsePromLine(line, runtime)
		if !ok {
			return Report{}, fmt.Errorf("parse /metrics: malformed sample on line %d", lineNo)
		}
		if f == fLoRA {
			s.lora(line, v)
			continue
		}
		s.add(f, v)
	}
	return s.report()
}

// promSums gathers the samples of one /metrics body into a Report, as ParsePrometheus documents:
// counts summed (saturating), throughput summed, ratios averaged, NaN and infinities skipped.
type promSums struct {
	r   Report
	sum [nPromFields]float64
	n   [nPromFields]int
}

// lora keeps the latest lora_requests_info sample (its value is when it was set; lora.go).
func (s *promSums) lora(line []byte, at float64) {
	i := bytes.IndexByte(line, '{')
	if i < 0 || math.IsNaN(at) || s.r.LoRA != nil && at < s.r.LoRA.At {
		return
	}
	l := parseLoraSample(line[i:], at)
	s.r.LoRA = &l
}

// add counts one sample of the metric feeding f.
func (s *promSums) add(f promField, v float64) {
	if f == fNone || math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	s.n[f]++
	switch f {
	case fRunning:
		s.r.Running = satAdd(s.r.Running, clampCount(v))
	case fWaiting:
		s.r.Waiting = satAdd(s.r.Waiting, clampCount(v))
	case fUsedTokens:
		s.r.UsedTokens = satAdd(s.r.UsedTokens, clampCount(v))
	case fGenTokens:
		s.r.GenTokensTotal = satAdd(s.r.GenTokensTotal, clampCount(v))
	case fPromptTokens:
		s.r.PromptTokensTotal = satAdd(s.r.PromptTokensTotal, clampCount(v))
	case fPrefillSecs:
		s.r.PrefillSecondsTotal = min(s.r.PrefillSecondsTotal+max(v, 0), maxPrefillSeconds)
	case fThroughput:
		s.sum[f] = clampRate(s.sum[f] + clampRate(v))
	case fHits, fQueries:
		s.sum[f] += max(v, 0)
	default: // ratios
		s.sum[f] += clampRatio(v)
	}
}

// report returns the Report of the samples added, or ErrNoLoadData without both a running and a
// waiting sample.
func (s *promSums) report() (Report, error) {
	r, sum, n := s.r, &s.sum, &s.n
	if n[fRunning] == 0 || n[fWaiting] == 0 {
		return Report{}, fmt.Errorf("parse /metrics: %w (running and waiting request gauges)", ErrNoLoadData)
	}
	switch {
	case n[fUsage] > 0:
		r.TokenUsage = sum[fUsage] / float64(n[fUsage])
	case n[fUsageOld] > 0:
		r.TokenUsage = sum[fUsageOld] / float64(n[fUsageOld])
	}
	switch {
	case n[fHitRate] > 0:
		r.CacheHitRate = sum[fHitRate] / float64(n[fHitRate])
	case sum[fQueries] > 0:
		r.CacheHitRate = clampRatio(sum[fHits] / sum[fQueries])
	}
	if n[fThroughput] > 0 {
		r.GenThroughput = sum[fThroughput]
		r.HasTokenData = true
	}
	if n[fHits] > 0 {
		r.PrefixHitTokensTotal = clampCount(sum[fHits])
	}
	if n[fQueries] > 0 {
		r.PrefixQueryTokensTotal = clampCount(sum[fQueries])
	}
	// A labelled histogram appears only once observed: an idle engine's page lacks the
	// prefill time, which is then 0.
	r.prefillCounted = n[fPromptTokens] > 0
	return r, nil
}

// parsePromLine parses one exposition line. It returns fNone for blank lines, comments and
// metrics that feed no field (without looking past their name), and ok false for a malformed
// sample of a metric that does.
func parsePromLine(line []byte, runtime string) (f promField, v float64, ok bool) {
	i := 0
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	if i == len(line) || line[i] == '#' {
		return fNone, 0, true
	}
	f, n := promFieldAt(line[i:], runtime)
	if f == fNone {
		return fNone, 0, true
	}
	i += n
	// The text format allows blanks between the name and its labels ("name {a="b"} 1").
	j := i
	for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
		j++
	}
	labels := j < len(line) && line[j] == '{'
	if labels {
		end := skipLabels(line[j:])
		if end < 0 {
			return f, 0, false
		}
		i = j + end
	}
	// A blank separates a bare name from its value (without one the value would be part of the
	// name); after a label set it may be left out, as the reference parser (expfmt) allows.
	if i == len(line) || (!labels && line[i] != ' ' && line[i] != '\t') {
		return f, 0, false
	}
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	start := i
	for i < len(line) && line[i] != ' ' && line[i] != '\t' && line[i] != '\r' {
		i++
	}
	v, ok = parseValue(line[start:i])
	return f, v, ok
}

// isNameByte reports whether c may appear in a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*).
func isNameByte(c byte, first bool) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == ':':
		return true
	case c >= '0' && c <= '9':
		return !first
	}
	return false
}

// skipLabels returns the length of the label set at the start of b ("{...}", quoted values with
// backslash escapes, so a '}' inside a value does not end it), or -1 if it is not closed.
func skipLabels(b []byte) int {
	inQuote := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case inQuote && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			inQuote = !inQuote
		case c == '}' && !inQuote:
			return i + 1
		}
	}
	return -1
}

// parseValue parses a sample value. Integers, also written "12.0" as Python clients do (the
// common case for counts), take an allocation-free fast path; anything else goes to
// strconv.ParseFloat.
func parseValue(b []byte) (float64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	if len(b) <= 15 {
		var n int64
		i := 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			n = n*10 + int64(b[i]-'0')
		}
		if i > 0 && i < len(b) && b[i] == '.' {
			j := i + 1
			for j < len(b) && b[j] == '0' {
				j++
			}
			if j == len(b) {
				i = j
			}
		}
		if i > 0 && i == len(b) {
			return float64(n), true
		}
	}
	v, err := strconv.ParseFloat(string(b), 64)
	return v, err == nil
}
