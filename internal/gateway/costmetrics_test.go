package gateway

import (
	"io"
	"net/url"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/policy"
)

// TestCostHeadersAndCalibration: with --audit-headers the default policy's decision shows the
// cost terms of the chosen worker and of the runner-up (numbers and audit ids only, never an
// address or a worker's id); every streamed request observes its predicted TTFT and the
// calibration error per worker.
func TestCostHeadersAndCalibration(t *testing.T) {
	g, ws := newAuditGateway(t, Config{AuditHeaders: true}, "cache_aware_hash", policy.DefaultConfig(), 2)
	ids := map[string]bool{}
	for _, w := range g.reg.View().All {
		ids[w.ID] = true
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("what does it cost ", 20) + `"}]}`
	for i := range 2 {
		resp := g.post(t, "/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		chosen, runner := resp.Header.Get("X-Kvgate-Cost"), resp.Header.Get("X-Kvgate-Cost-Runner-Up")
		for name, v := range map[string]string{"chosen": chosen, "runner-up": runner} {
			for _, term := range []string{"worker=", " q=", " s=", " p=", " c=", " b=", " mu=", " d=", " cost="} {
				if !strings.Contains(v, term) {
					t.Fatalf("request %d: %s terms %q lack %q", i, name, v, term)
				}
			}
			// Workers are named by their audit ids (an opaque keyed hash), never their real ids.
			id := strings.TrimPrefix(strings.Fields(v)[0], "worker=")
			if ids[id] || len(id) != 16 {
				t.Fatalf("request %d: %s names %q, want a 16-digit audit id", i, name, id)
			}
			for _, f := range ws {
				u, _ := url.Parse(f.URL)
				if strings.Contains(v, u.Host) {
					t.Fatalf("request %d: %s terms %q show a worker address", i, name, v)
				}
			}
		}
		if strings.Fields(chosen)[0] == strings.Fields(runner)[0] {
			t.Fatalf("request %d: the runner-up is the chosen worker: %q / %q", i, chosen, runner)
		}
		if w := resp.Header.Get("X-Kvgate-Worker"); !strings.HasPrefix(chosen, "worker="+w+" ") {
			t.Fatalf("request %d: cost terms %q are not the picked worker %s's", i, chosen, w)
		}
	}
	g.waitDone(t, 2)
	mfs, err := g.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvgate_route_predicted_ttft_seconds", "kvgate_route_ttft_error_seconds":
				counts[mf.GetName()] += m.GetHistogram().GetSampleCount()
				if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "worker" || !ids[l[0].GetValue()] {
					t.Fatalf("%s labels %v, want one worker id", mf.GetName(), l)
				}
			}
		}
	}
	if counts["kvgate_route_predicted_ttft_seconds"] != 2 || counts["kvgate_route_ttft_error_seconds"] != 2 {
		t.Fatalf("calibration samples %v, want 2 predictions and 2 errors", counts)
	}
}
