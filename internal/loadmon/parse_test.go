package loadmon

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
)

// Canned bodies shaped like real servers' (trimmed).
const (
	loadsTwoRanks = `{"timestamp": "2026-01-01T00:00:00Z", "dp_rank_count": 2,
 "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "num_waiting_uncached_tokens": 512,
            "num_total_reqs": 4, "num_used_tokens": 20480, "max_total_num_tokens": 524288,
            "token_usage": 0.04, "gen_throughput": 812.5, "cache_hit_rate": 0.61, "utilization": 0.04,
            "max_running_requests": 256},
           {"dp_rank": 1, "num_running_reqs": 5, "num_waiting_reqs": 2.0, "num_waiting_uncached_tokens": 100,
            "num_used_tokens": 1000, "max_total_num_tokens": 524288,
            "token_usage": 0.08, "gen_throughput": 100, "cache_hit_rate": 0.41}]}`

	vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 4.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
vllm:prefix_cache_hits_created{engine="0",model_name="llama"} 1.7e+09
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 12.0
python_gc_objects_collected_total{generation="0"} 1234.0
`
	vllmOldMetrics = "vllm:num_requests_running{model_name=\"m\"} 1\nvllm:num_requests_waiting{model_name=\"m\"} 2\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.75\n"

	sglangOldMetrics = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 12.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 3.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.3
sglang:gen_throughput{model_name="qwen",tp_rank="0"} 1500.5
sglang:cache_hit_rate{model_name="qwen",tp_rank="0"} 0.7
sglang:num_used_tokens{model_name="qwen",tp_rank="0"} 9000.0
`
	sglangNewMetrics = "sglang_num_running_reqs{model_name=\"q\"} 1\r\nsglang_num_queue_reqs{model_name=\"q\"} 0\r\nsglang_gen_throughput{model_name=\"q\"} 0 1700000000000\r\n"
)

func TestParseLoads(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Report
		wantErr error // nil: no error; errAny: any error
	}{
		{"two ranks sum counts and average ratios", loadsTwoRanks, Report{
			Running: 8, Waiting: 3, WaitingUncachedTokens: 612, UsedTokens: 21480, MaxTokens: 1048576,
			TokenUsage: 0.06, GenThroughput: 912.5, CacheHitRate: 0.51, HasTokenData: true, HasUncachedTokens: true}, nil},
		{"counts only has no token data", `{"loads":[{"num_running_reqs":2,"num_waiting_reqs":1}]}`,
			Report{Running: 2, Waiting: 1}, nil},
		{"empty loads is an idle worker", `{"loads":[]}`, Report{}, nil},
		{"negative and NaN-free garbage values clamp to zero", `{"loads":[{"num_running_reqs":-5,"token_usage":7,"gen_throughput":-1}]}`,
			Report{TokenUsage: 1, HasTokenData: true}, nil},
		{"huge counts are capped, not wrapped", `{"loads":[{"num_running_reqs":1e300},{"num_running_reqs":1e300}]}`,
			Report{Running: 2 * maxCount}, nil},
		{"no loads field", `{"status":"ok"}`, Report{}, ErrNoLoadData},
		{"null loads", `{"loads":null}`, Report{}, ErrNoLoadData},
		{"truncated", loadsTwoRanks[:len(loadsTwoRanks)/2], Report{}, errAny},
		{"html error page", `<html>502 Bad Gateway</html>`, Report{}, errAny},
		{"wrong type", `{"loads":[{"num_running_reqs":"three"}]}`, Report{}, errAny},
		{"empty", ``, Report{}, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLoads([]byte(tt.body))
			checkErr(t, err, tt.wantErr)
			if err == nil && !reportsClose(got, tt.want) {
				t.Fatalf("ParseLoads = %+v\nwant          %+v", got, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func checkErr(t *testing.T, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want == errAny && err == nil, want != nil && want != errAny && !errors.Is(err, want):
		t.Fatalf("error = %v, want %v", err, want)
	}
}

func reportsClose(a, b Report) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return a.Running == b.Running && a.Waiting == b.Waiting && a.WaitingUncachedTokens == b.WaitingUncachedTokens &&
		a.UsedTokens == b.UsedTokens && a.MaxTokens == b.MaxTokens && a.HasTokenData == b.HasTokenData &&
		a.HasUncachedTokens == b.HasUncachedTokens && a.GenTokensTotal == b.GenTokensTotal &&
		near(a.TokenUsage, b.TokenUsage) && near(a.GenThroughput, b.GenThroughput) && near(a.CacheHitRate, b.CacheHitRate)
}

func TestParsePrometheus(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		runtime string
		want    Report
		wantErr error
	}{
		{"vllm sums label sets, averages usage, hit ratio from counters", vllmMetrics, RuntimeVLLM,
			Report{Running: 6, Waiting: 7, TokenUsage: 0.375, CacheHitRate: 0.25}, nil},
		{"vllm generated-tokens counter", vllmMetrics + "vllm:generation_tokens_total{engine=\"0\"} 1500.0\nvllm:generation_tokens_total{engine=\"1\"} 500\n",
			RuntimeVLLM, Report{Running: 6, Waiting: 7, TokenUsage: 0.375, CacheHitRate: 0.25, GenTokensTotal: 2000}, nil},
		{"vllm old kv usage name", vllmOldMetrics, RuntimeVLLM, Report{Running: 1, Waiting: 2, TokenUsage: 0.75}, nil},
		{"vllm with unknown runtime", vllmMetrics, "", Report{Running: 6, Waiting: 7, TokenUsage: 0.375, CacheHitRate: 0.25}, nil},
		{"sglang colon prefix", sglangOldMetrics, RuntimeSGLang, Report{Running: 12, Waiting: 3, TokenUsage: 0.3,
			GenThroughput: 1500.5, CacheHitRate: 0.7, UsedTokens: 9000, HasTokenData: true}, nil},
		{"sglang underscore prefix, CRLF, timestamps", sglangNewMetrics, RuntimeSGLang,
			Report{Running: 1, HasTokenData: true}, nil},
		{"sglang metrics are not vllm's", sglangOldMetrics, RuntimeVLLM, Report{}, ErrNoLoadData},
		{"vllm metrics are not sglang's", vllmMetrics, RuntimeSGLang, Report{}, ErrNoLoadData},
		{"label values may hold braces, quotes and escapes",
			"vllm:num_requests_running{model_name=\"a}b\\\"c\\\\\",x=\"{\"} 3\nvllm:num_requests_waiting 4\n", "",
			Report{Running: 3, Waiting: 4}, nil},
		{"tabs and leading spaces", "  vllm:num_requests_running\t5\n\tvllm:num_requests_waiting  1\n", "", Report{Running: 5, Waiting: 1}, nil},
		{"NaN and Inf samples are ignored", "vllm:num_requests_running NaN\nvllm:num_requests_running 2\nvllm:num_requests_waiting +Inf\nvllm:num_requests_waiting 1\n", "",
			Report{Running: 2, Waiting: 1}, nil},
		{"scientific notation", "vllm:num_requests_running 1.2e1\nvllm:num_requests_waiting 0x1p1\n", "", Report{Running: 12, Waiting: 2}, nil},
		{"malformed unrelated lines are ignored", "}}} garbage {{{\n9bad 1\nvllm:num_requests_running 1\nvllm:num_requests_waiting 1\nfoo{a=\"unterminated 1\n", "",
			Report{Running: 1, Waiting: 1}, nil},
		{"a name that extends a read name is another metric",
			"vllm:num_requests_running_total 9\nvllm:num_requests_running:x{a=\"b\"} 9\nvllm:num_requests_runningZ 9\nsglang_token_usage2 1\n" +
				"vllm:num_requests_running 1\nvllm:num_requests_waiting 1\nvllm:num_requests_waiting_bad value\n", "",
			Report{Running: 1, Waiting: 1}, nil},
		{"only waiting is no data", "vllm:num_requests_waiting 3\n", "", Report{}, ErrNoLoadData},
		{"empty", "", "", Report{}, ErrNoLoadData},
		{"unterminated labels", "vllm:num_requests_running{a=\"b\" 3\nvllm:num_requests_waiting 1\n", "", Report{}, errAny},
		{"missing value", "vllm:num_requests_running\nvllm:num_requests_waiting 1\n", "", Report{}, errAny},
		{"bad value", "vllm:num_requests_running 3x\nvllm:num_requests_waiting 1\n", "", Report{}, errAny},
		{"value right after the labels (expfmt accepts it)", "vllm:num_requests_running{a=\"b\"}3\nvllm:num_requests_waiting{}1\n", "",
			Report{Running: 3, Waiting: 1}, nil},
		{"name glued to value", "vllm:num_requests_running3\nvllm:num_requests_waiting 1\n", "", Report{}, ErrNoLoadData},
		{"binary garbage", "\x00\xff\xfe vllm:\x00", "", Report{}, ErrNoLoadData},
		{"json is not metrics", loadsTwoRanks, "", Report{}, ErrNoLoadData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePrometheus([]byte(tt.body), tt.runtime)
			checkErr(t, err, tt.wantErr)
			if err == nil && !reportsClose(got, tt.want) {
				t.Fatalf("ParsePrometheus = %+v\nwant               %+v", got, tt.want)
			}
		})
	}
}

// checkReport asserts the invariants every parsed report must hold, whatever the input.
func checkReport(t *testing.T, r Report) {
	t.Helper()
	for name, v := range map[string]int64{"running": r.Running, "waiting": r.Waiting, "uncached": r.WaitingUncachedTokens,
		"used": r.UsedTokens, "max": r.MaxTokens, "backlog": r.Backlog()} {
		if v < 0 {
			t.Fatalf("%s = %d < 0 in %+v", name, v, r)
		}
	}
	for name, v := range map[string]float64{"usage": r.TokenUsage, "hit": r.CacheHitRate} {
		if !(v >= 0 && v <= 1) {
			t.Fatalf("%s = %v outside [0,1] in %+v", name, v, r)
		}
	}
	if !(r.GenThroughput >= 0 && r.GenThroughput <= maxThroughput) {
		t.Fatalf("throughput = %v out of range", r.GenThroughput)
	}
}

// parseLoadsReference is the obvious ParseLoads, on encoding/json: the model the allocation-free
// scanner must agree with, body for body.
func parseLoadsReference(body []byte) (Report, error) {
	var b struct {
		Loads *[]struct {
			Running         float64  `json:"num_running_reqs"`
			Waiting         float64  `json:"num_waiting_reqs"`
			WaitingUncached *float64 `json:"num_waiting_uncached_tokens"`
			UsedTokens      float64  `json:"num_used_tokens"`
			MaxTokens       float64  `json:"max_total_num_tokens"`
			MaxRunning      float64  `json:"max_running_requests"`
			TokenUsage      *float64 `json:"token_usage"`
			GenThroughput   *float64 `json:"gen_throughput"`
			CacheHitRate    *float64 `json:"cache_hit_rate"`
			BusyTokens      float64  `json:"total_prefill_uncached_tokens"`
			BusyMicros      *float64 `json:"total_prefill_busy_us"`
		} `json:"loads"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Report{}, err
	}
	if b.Loads == nil {
		return Report{}, ErrNoLoadData
	}
	opt := func(p *float64) (float64, bool) {
		if p == nil {
			return 0, false
		}
		return *p, true
	}
	var ranks []Rank
	for _, l := range *b.Loads {
		r := Rank{Running: l.Running, Waiting: l.Waiting, UsedTokens: l.UsedTokens, MaxTokens: l.MaxTokens, MaxRunning: l.MaxRunning}
		r.WaitingUncachedTokens, r.HasUncached = opt(l.WaitingUncached)
		r.TokenUsage, r.HasUsage = opt(l.TokenUsage)
		r.GenThroughput, r.HasThroughput = opt(l.GenThroughput)
		r.CacheHitRate, r.HasHitRate = opt(l.CacheHitRate)
		r.PrefillBusyTokens = l.BusyTokens
		r.PrefillBusyMicros, r.HasBusy = opt(l.BusyMicros)
		ranks = append(ranks, r)
	}
	return ReportOf(ranks...), nil
}

// FuzzParseLoads checks the scanner against encoding/json: same verdict, same report.
func FuzzParseLoads(f *testing.F) {
	for _, s := range []string{loadsTwoRanks, `{"loads":[]}`, `{"loads":[{"num_running_reqs":1e300,"token_usage":-3}]}`,
		`{"loads":null}`, `[]`, `{"loads":[{"gen_throughput":"x"}]}`, loadsTwoRanks[:40], `null`, ` {"loads":[null]} `,
		`{"LOADS":[{"Num_Running_Reqs":2,"num_running_reqs":null,"token_usage":0.5,"token_usage":null}]}`,
		`{"lo\u0061ds":[{"to\u212Aen_usage":0.5,"x":{"y":[1,true,false,null,"\ud83d\ude00"]}}]}`,
		`{"loads":[{"num_running_reqs":-0.5e+2}]} x`, `{"loads":[{"num_running_reqs":01}]}`, `{"loads":[1]}`,
		`{"loads":[{"num_running_reqs":1e400}]}`, "{\"loads\":[{\"a\":\"\x01\"}]}", `{"loads":[],}`, `{"a":"\ud800\u0041"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseLoads(body)
		want, wantErr := parseLoadsReference(body)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("ParseLoads(%q) error %v, encoding/json says %v", body, err, wantErr)
		}
		if err != nil {
			return
		}
		if got != want {
			t.Fatalf("ParseLoads(%q) = %+v\nencoding/json gives %+v", body, got, want)
		}
		checkReport(t, got)
	})
}

func FuzzParsePrometheus(f *testing.F) {
	for _, s := range []string{vllmMetrics, vllmOldMetrics, sglangOldMetrics, sglangNewMetrics, vllmMetrics[:200],
		"vllm:num_requests_running{a=\"}\\\"\"} 1\nvllm:num_requests_waiting -3\n", "sglang_num_queue_reqs 1e400\nsglang_num_running_reqs 5"} {
		for _, rt := range []string{"", RuntimeVLLM, RuntimeSGLang} {
			f.Add([]byte(s), rt)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, runtime string) {
		r, err := ParsePrometheus(body, runtime)
		if err == nil {
			checkReport(t, r)
		}
	})
}

// FuzzPrometheusRoundTrip writes a vLLM body from fuzzed values and label text and checks that
// the parser reads back exactly what was written.
func FuzzPrometheusRoundTrip(f *testing.F) {
	f.Add(uint32(3), uint32(1), uint16(500), "llama", uint8(1))
	f.Add(uint32(math.MaxUint32), uint32(math.MaxUint32), uint16(1000), "a}b\"c\\{", uint8(4))
	f.Add(uint32(0), uint32(0), uint16(0), "\n\t ", uint8(0))
	f.Fuzz(func(t *testing.T, running, waiting uint32, usageMilli uint16, label string, sets uint8) {
		usage := float64(usageMilli%1001) / 1000
		n := int(sets%8) + 1
		var b strings.Builder
		b.WriteString("# HELP vllm:num_requests_running x\n")
		for i := range n {
			l := fmt.Sprintf("{model_name=%s,engine=\"%d\"}", strconv.Quote(label), i)
			fmt.Fprintf(&b, "vllm:num_requests_running%s %d\nvllm:num_requests_waiting%s %d.0\n", l, running, l, waiting)
			fmt.Fprintf(&b, "vllm:kv_cache_usage_perc%s %s\nother_metric%s 7\n", l, strconv.FormatFloat(usage, 'g', -1, 64), l)
		}
		r, err := ParsePrometheus([]byte(b.String()), RuntimeVLLM)
		if err != nil {
			t.Fatalf("ParsePrometheus(%q): %v", b.String(), err)
		}
		want := Report{Running: int64(n) * int64(running), Waiting: int64(n) * int64(waiting), TokenUsage: usage}
		if !reportsClose(r, want) {
			t.Fatalf("got %+v, want %+v from\n%s", r, want, b.String())
		}
	})
}

func BenchmarkParsePrometheusVLLM(b *testing.B) {
	body := []byte(strings.Repeat(vllmMetrics, 40)) // ~40 engines: a large /metrics body
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParsePrometheus(body, RuntimeVLLM); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseLoads(b *testing.B) {
	body := []byte(loadsTwoRanks)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseLoads(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseLoadsReference is encoding/json on the same body, for the side-by-side ratio.
func BenchmarkParseLoadsReference(b *testing.B) {
	body := []byte(loadsTwoRanks)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseLoadsReference(body); err != nil {
			b.Fatal(err)
		}
	}
}

// SGLang's cumulative prefill counters: the tokens summed over the data-parallel ranks, the busy
// seconds their mean (two ranks each prefilling 8,000 tokens in a second of prefill drain the
// worker's summed queue at 16,000 tokens/s), microseconds read as seconds; a body without them
// has none counted, and hostile values are clamped.
func TestParseLoadsPrefillBusyCounters(t *testing.T) {
	r, err := ParseLoads([]byte(`{"loads":[{"num_running_reqs":1,"total_prefill_uncached_tokens":8000,"total_prefill_busy_us":1000000},
		{"num_running_reqs":2,"total_prefill_uncached_tokens":8000,"total_prefill_busy_us":1000000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if b := r.Busy(); !b.Counted || b.Tokens != 16000 || b.Seconds != 1 {
		t.Fatalf("busy counters %+v, want 16000 tokens in 1 s of the ranks' prefill", b)
	}
	r, _ = ParseLoads([]byte(`{"loads":[{"total_prefill_uncached_tokens":409397,"total_prefill_busy_us":73636110}]}`))
	if b := r.Busy(); b.Tokens != 409397 || math.Abs(b.Seconds-73.63611) > 1e-9 {
		t.Fatalf("one rank: %+v, want 409397 tokens in 73.63611 s", b)
	}
	if r, _ := ParseLoads([]byte(loadsTwoRanks)); r.Busy().Counted {
		t.Fatalf("a body without the counters reads %+v", r.Busy())
	}
	r, _ = ParseLoads([]byte(`{"loads":[{"total_prefill_uncached_tokens":-5,"total_prefill_busy_us":1e300}]}`))
	if b := r.Busy(); b.Tokens != 0 || b.Seconds != maxPrefillSeconds {
		t.Fatalf("hostile counters read %+v, want 0 tokens and %g s", b, float64(maxPrefillSeconds))
	}
}
