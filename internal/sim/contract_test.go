package sim

import (
	"io"
	"net/http"
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
			res, err := http.Get(ts.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			r, err := tc.parse(raw)
			if err != nil {
				t.Fatalf("loadmon cannot parse %s: %v\n%s", tc.path, err, raw)
			}
			if r.Running != 1 || r.Waiting != 0 || r.TokenUsage <= 0 {
				t.Errorf("loadmon read %+v from\n%s", r, raw)
			}
		})
	}
}
