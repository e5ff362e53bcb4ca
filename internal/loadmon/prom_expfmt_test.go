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

// expfmtReport reads body with the reference parser, client_golang's expfmt, and gathers the
// samples of the metrics a runtime's fields read as ParsePrometheus does (promSums), so that the
// two differ only in how they read the text. ok is false when expfmt rejects the body or types
// one of those metrics as a histogram or summary (whose samples the text format writes under
// other names), where the two are not comparable.
func expfmtReport(body []byte, runtime string) (r Report, ok bool, err error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, perr := p.TextToMetricFamilies(bytes.NewReader(body))
	if perr != nil {
		return Report{}, false, nil
	}
	var s promSums
	for name, mf := range families {
		f := promFieldOf([]byte(name), runtime)
		if f == fNone {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				s.add(f, m.GetGauge().GetValue())
			case dto.MetricType_COUNTER:
				s.add(f, m.GetCounter().GetValue())
			case dto.MetricType_UNTYPED:
				s.add(f, m.GetUntyped().GetValue())
			default:
				return Report{}, false, nil
			}
		}
	}
	r, err = s.report()
	return r, true, err
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
		want, ok, wantErr := expfmtReport(body, runtime)
		if !ok {
			return
		}
		got, err := ParsePrometheus(body, runtime)
		if wantErr != nil {
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
