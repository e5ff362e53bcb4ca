package loadmon

import (
	"bytes"
	"errors"
	"math"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// expfmtReport computes what ParsePrometheus should return for body from the reference parser,
// client_golang's expfmt: the samples of the metric names a runtime's fields read, summed or
// averaged as ParsePrometheus documents. ok is false when expfmt rejects the body or types one of
// those metrics as a histogram or summary (whose samples the text format writes under other
// names), where the two parsers are not comparable.
func expfmtReport(body []byte, runtime string) (r Report, hasLoad, ok bool) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return Report{}, false, false
	}
	var (
		sum [nPromFields]float64
		n   [nPromFields]int
	)
	for name, mf := range families {
		f := promFieldOf([]byte(name), runtime)
		if f == fNone {
			continue
		}
		for _, m := range mf.GetMetric() {
			var v float64
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_UNTYPED:
				v = m.GetUntyped().GetValue()
			default:
				return Report{}, false, false
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			n[f]++
			switch f {
			case fRunning:
				r.Running = satAdd(r.Running, clampCount(v))
			case fWaiting:
				r.Waiting = satAdd(r.Waiting, clampCount(v))
			case fUsedTokens:
				r.UsedTokens = satAdd(r.UsedTokens, clampCount(v))
			case fGenTokens:
				r.GenTokensTotal = satAdd(r.GenTokensTotal, clampCount(v))
			case fThroughput:
				sum[f] = clampRate(sum[f] + clampRate(v))
			case fHits, fQueries:
				sum[f] += max(v, 0)
			default:
				sum[f] += clampRatio(v)
			}
		}
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
	return r, n[fRunning] > 0 && n[fWaiting] > 0, true
}

// sameSum reports whether two sums of the same samples, added in different orders, agree.
func sameSum(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b), 1)
}

// FuzzPrometheusAgainstExpfmt is a differential test: every body the reference text parser
// accepts, ParsePrometheus must accept too, and read the same load from it. (The reverse need
// not hold: ParsePrometheus skips the lines of metrics it does not read without parsing them.)
func FuzzPrometheusAgainstExpfmt(f *testing.F) {
	for _, s := range []string{vllmMetrics, vllmOldMetrics, sglangOldMetrics,
		"sglang_num_running_reqs{model_name=\"q\"} 1\nsglang_num_queue_reqs{model_name=\"q\"} 0\nsglang_gen_throughput{model_name=\"q\"} 12.5 1700000000000\n",
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{a=\"}\\\"\",b=\"x\"} 2\nvllm:num_requests_waiting 3e0\n",
		"vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc +Inf\n",
		"vllm:num_requests_running\t 4 \nvllm:num_requests_waiting{} 1\n",
		"vllm:num_requests_running {model_name=\"m\"} 2\nvllm:num_requests_waiting 0\n",
		"# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_bucket{le=\"+Inf\"} 1\n",
	} {
		for _, rt := range []string{"", RuntimeVLLM, RuntimeSGLang} {
			f.Add([]byte(s), rt)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, runtime string) {
		want, hasLoad, ok := expfmtReport(body, runtime)
		if !ok {
			return
		}
		got, err := ParsePrometheus(body, runtime)
		if !hasLoad {
			if !errors.Is(err, ErrNoLoadData) {
				t.Fatalf("expfmt finds no running and waiting gauges; ParsePrometheus: %+v, %v\nbody %q", got, err, body)
			}
			return
		}
		if err != nil {
			t.Fatalf("expfmt accepts the body, ParsePrometheus fails: %v\nbody %q", err, body)
		}
		if got.Running != want.Running || got.Waiting != want.Waiting || got.UsedTokens != want.UsedTokens ||
			got.GenTokensTotal != want.GenTokensTotal || got.HasTokenData != want.HasTokenData ||
			!sameSum(got.TokenUsage, want.TokenUsage) || !sameSum(got.CacheHitRate, want.CacheHitRate) ||
			!sameSum(got.GenThroughput, want.GenThroughput) {
			t.Fatalf("ParsePrometheus read\n %+v\nexpfmt reads\n %+v\nbody %q", got, want, body)
		}
	})
}
