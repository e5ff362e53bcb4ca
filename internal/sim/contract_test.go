package sim

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// TestGatewayReadsOurLoads is the contract with the gateway's load monitor: what the simulator
// serves on /v1/loads and /metrics, loadmon parses into the load it reports.
func TestGatewayReadsOurLoads(t *testing.T) {
	for _, tc := range []struct {
		flavor, path string
		parse        func([]byte) (loadmon.Report, error)
	}{
		{FlavorSGLang, "/v1/loads?include=core", loadmon.ParseLoads},
		{FlavorSGLang, "/metrics", func(b []byte) (loadmon.Report, error) { return loadmon.ParsePrometheus(b, "sglang") }},
		{FlavorVLLM, "/metrics", func(b []byte) (loadmon.Report, error) { return loadmon.ParsePrometheus(b, "vllm") }},
	} {
		t.Run(tc.flavor+tc.path, func(t *testing.T) {
			cfg := slowConfig()
			cfg.Flavor = tc.flavor
			_, ts := startServer(t, cfg)
			cancel, body := streamUntilFirstChunk(t, ts.URL)
			defer cancel()
			defer body.Close()
			r, raw := fetchReport(t, ts.URL+tc.path, tc.parse)
			if r.Running != 1 || r.Waiting != 0 || r.TokenUsage <= 0 {
				t.Errorf("loadmon read %+v from\n%s", r, raw)
			}
		})
	}
}

// TestLoadsCountPrefillBusy: /v1/loads carries SGLang's cumulative prefill counters, the prompt
// tokens the prefill steps computed and those steps' time, so that the gateway reads the rate the
// engine prefills at from them (loadmon.Estimate.Observe): one 4,096-token prompt at 100,000
// tokens a second is 4,096 tokens in 40.96 ms, and a second request for it, served from the
// cache, computes only what the cache cannot give.
func TestLoadsCountPrefillBusy(t *testing.T) {
	cfg := fastConfig()
	cfg.Engine.PrefillTPS = 100_000
	_, ts := startServer(t, cfg)
	read := func() loadmon.Busy {
		t.Helper()
		r, _ := fetchReport(t, ts.URL+"/v1/loads?include=core", loadmon.ParseLoads)
		return r.Busy()
	}
	if b := read(); !b.Counted || b.Tokens != 0 || b.Seconds != 0 {
		t.Fatalf("an idle engine counts %+v, want zero counters", b)
	}
	body := `{"max_tokens":1,"prompt":"` + strings.Repeat("abcd", 4096) + `"}`
	post(t, ts.URL+"/v1/completions", body)
	b := read()
	if b.Tokens != 4096 || math.Abs(b.Seconds-0.04096) > 1e-6 {
		t.Fatalf("after one 4,096-token prompt: %+v, want 4096 tokens in 0.04096 s", b)
	}
	post(t, ts.URL+"/v1/completions", body)
	if again := read(); again.Tokens-b.Tokens >= 64 || again.Tokens <= b.Tokens {
		t.Fatalf("the cached prompt computed %g more tokens, want only its uncached tail", again.Tokens-b.Tokens)
	}
}

// fetchReport GETs url and parses the body with parse, failing the test where either fails; it
// returns the body too.
func fetchReport(t *testing.T, url string, parse func([]byte) (loadmon.Report, error)) (loadmon.Report, []byte) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	r, err := parse(raw)
	if err != nil {
		t.Fatalf("loadmon cannot parse %s: %v\n%s", url, err, raw)
	}
	return r, raw
}
