package loadmon

import (
	"strconv"
	"testing"
	"time"
)

// The prefill rate comes from the growth of vLLM's counters between two polls, with the prefix
// cache's hits taken out; a restarted engine, a first poll and a gap give none.
func TestPrefillRateFromVLLMCounters(t *testing.T) {
	page := func(prompt, hits int, secs float64) string {
		return "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n" +
			"vllm:prompt_tokens_total{model_name=\"m\"} " + itoa(prompt) + "\n" +
			"vllm:prefix_cache_hits_total{model_name=\"m\"} " + itoa(hits) + "\n" +
			"vllm:request_prefill_time_seconds_bucket{le=\"+Inf\"} 3\n" +
			"vllm:request_prefill_time_seconds_sum{model_name=\"m\"} " + ftoa(secs) + "\n"
	}
	var c PrefillCounters
	at := time.Unix(1000, 0)
	poll := func(body string, dt time.Duration) Report {
		t.Helper()
		r, err := ParsePrometheus([]byte(body), RuntimeVLLM)
		if err != nil {
			t.Fatal(err)
		}
		at = at.Add(dt)
		r.PolledAt = at
		c.Derive(&r, 10*time.Second)
		return r
	}
	if r := poll(page(1000, 0, 1), time.Second); r.PrefillRate != 0 || r.PromptTokensTotal != 1000 || r.PrefillSecondsTotal != 1 {
		t.Fatalf("first poll: %+v", r)
	}
	// 3,000 more prompt tokens, 1,000 of them hits, in 2 s of prefill: 1,000 tokens/s.
	if r := poll(page(4000, 1000, 3), time.Second); r.PrefillRate != 1000 {
		t.Fatalf("rate %v, want 1000", r.PrefillRate)
	}
	// One interval whose tokens came without their prefill time (counted on arrival, timed at
	// the first token) moves the rate by its share of the sums, not to its own 40,000 tokens/s.
	for i := 1; i <= 3; i++ { // three more intervals of 2,000 uncached tokens in 2 s
		if r := poll(page(4000+3000*i, 1000+1000*i, 3+2*float64(i)), time.Second); r.PrefillRate != 1000 {
			t.Fatalf("steady interval %d: rate %v, want 1000", i, r.PrefillRate)
		}
	}
	if r := poll(page(17000, 4000, 9.1), time.Second); r.PrefillRate < 1000 || r.PrefillRate > 2000 {
		t.Fatalf("after a burst of arrivals: rate %v, want near the 1000 of the sums", r.PrefillRate)
	}
	if r := poll(page(10, 0, 0.1), time.Second); r.PrefillRate != 0 {
		t.Fatalf("after a restart: rate %v, want none", r.PrefillRate)
	}
	if r := poll(page(5000, 0, 5), time.Minute); r.PrefillRate != 0 {
		t.Fatalf("across a gap: rate %v, want none", r.PrefillRate)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func ftoa(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// Where the page counts prefix-cache queries, the uncached tokens are the queries less the hits,
// whatever the prompt-token counter says: an engine that counts prompt tokens when a request
// finishes has them lag the hits counted when it was looked up.
func TestPrefillRateFromCacheQueries(t *testing.T) {
	page := func(prompt, queries, hits int, secs float64) string {
		return "vllm:num_requests_running 4\nvllm:num_requests_waiting 0\n" +
			"vllm:prompt_tokens_total{model_name=\"m\"} " + itoa(prompt) + "\n" +
			"vllm:prefix_cache_queries_total{model_name=\"m\"} " + itoa(queries) + "\n" +
			"vllm:prefix_cache_hits_total{model_name=\"m\"} " + itoa(hits) + "\n" +
			"vllm:request_prefill_time_seconds_sum{model_name=\"m\"} " + ftoa(secs) + "\n"
	}
	var c PrefillCounters
	at := time.Unix(1000, 0)
	for i, p := range []string{page(0, 0, 0, 0), page(0, 1000, 0, 1), page(1000, 5000, 3500, 2.5)} {
		r, err := ParsePrometheus([]byte(p), RuntimeVLLM)
		if err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
		r.PolledAt = at
		c.Derive(&r, 10*time.Second)
		// 1,000 uncached in 1 s, then 500 more (4,000 looked up, 3,500 hits) in 1.5 s: 1,500
		// tokens in 2.5 s once the first interval is 0.875 of itself.
		if want := []float64{0, 1000, (1000*rateKeep + 500) / (1*rateKeep + 1.5)}[i]; r.PrefillRate != want {
			t.Fatalf("poll %d: rate %v, want %v (%+v)", i, r.PrefillRate, want, r)
		}
	}
}
