package gateway

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// wantMetrics compares the named metric families the gateway exports with want, Prometheus text
// with its HELP and TYPE lines: every series of those families and no other, each with its exact
// value (client_golang's testutil.GatherAndCompare, which prints the difference).
func wantMetrics(t *testing.T, g *testGateway, want string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(g.Metrics().Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// family returns the gathered metric family called name, or nil.
func family(t *testing.T, g *testGateway, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name })
	if i < 0 {
		return nil
	}
	return mfs[i]
}

// countSeries returns how many series, in every family the gateway exports, have labels that
// match says yes to.
func countSeries(t *testing.T, g *testGateway, match func(labels map[string]string) bool) int {
	t.Helper()
	mfs, err := g.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if match(labelsOf(m)) {
				n++
			}
		}
	}
	return n
}

// labelsOf returns a series' labels as a map.
func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// histogramCount returns the observation count of the series of histogram name whose labels
// include match, failing when there is none.
func histogramCount(t *testing.T, g *testGateway, name string, match map[string]string) uint64 {
	t.Helper()
	if mf := family(t, g, name); mf != nil {
		for _, m := range mf.GetMetric() {
			ls := labelsOf(m)
			ok := true
			for k, v := range match {
				ok = ok && ls[k] == v
			}
			if ok {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	t.Fatalf("no %s series with %v", name, match)
	return 0
}

// The gateway's request, selection and per-worker families after a known sequence of requests,
// in full: names, help, types, labels and values.
func TestMetricsGolden(t *testing.T) {
	a, b := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin", a, b)
	for _, body := range []string{chatFor("m"), chatFor("m"), chatFor("m"), chatFor("m"), `{"model":"nope","messages":[]}`, `{"model":`} {
		resp := g.postBounded(t, "/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		g.waitDone(t, 1)
	}
	var workers strings.Builder
	for _, w := range g.reg.View().All {
		fmt.Fprintf(&workers, `
kvgate_policy_selections_total{model="m",policy="round_robin",worker="%[1]s"} 2
kvgate_worker_inflight{url="%[2]s",worker="%[1]s"} 0
kvgate_worker_processed_total{url="%[2]s",worker="%[1]s"} 2
kvgate_worker_circuit_state{state="closed",worker="%[1]s"} 1
kvgate_worker_circuit_state{state="half_open",worker="%[1]s"} 0
kvgate_worker_circuit_state{state="open",worker="%[1]s"} 0
kvgate_worker_health{state="not_ready",worker="%[1]s"} 0
kvgate_worker_health{state="pending",worker="%[1]s"} 0
kvgate_worker_health{state="ready",worker="%[1]s"} 1`, w.ID, w.Spec.URL)
	}
	// The text format wants each family's series together, under its HELP and TYPE lines.
	byFamily := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(workers.String()), "\n") {
		name, _, _ := strings.Cut(line, "{")
		byFamily[name] = append(byFamily[name], line)
	}
	want := `# HELP kvgate_requests_total Client requests by route, model and status.
# TYPE kvgate_requests_total counter
kvgate_requests_total{model="",route="/v1/chat/completions",status="400"} 1
kvgate_requests_total{model="",route="/v1/chat/completions",status="404"} 1
kvgate_requests_total{model="m",route="/v1/chat/completions",status="200"} 4
`
	for _, f := range []struct{ name, help, typ string }{
		{"kvgate_policy_selections_total", "Workers picked, by policy, model and worker.", "counter"},
		{"kvgate_worker_inflight", "Requests this gateway has in flight to the worker.", "gauge"},
		{"kvgate_worker_processed_total", "Requests this gateway finished on the worker.", "counter"},
		{"kvgate_worker_circuit_state", "1 for the worker's current circuit state (closed, open, half_open).", "gauge"},
		{"kvgate_worker_health", "1 for the worker's current health state (pending, ready, not_ready).", "gauge"},
	} {
		want += fmt.Sprintf("# HELP %s %s\n# TYPE %s %s\n%s\n", f.name, f.help, f.name, f.typ, strings.Join(byFamily[f.name], "\n"))
	}
	wantMetrics(t, g, want, "kvgate_requests_total", "kvgate_policy_selections_total", "kvgate_worker_inflight",
		"kvgate_worker_processed_total", "kvgate_worker_circuit_state", "kvgate_worker_health", "kvgate_upstream_errors_total",
		"kvgate_retries_total")
	if n := histogramCount(t, g, "kvgate_request_duration_seconds", map[string]string{"model": "m"}); n != 4 {
		t.Errorf("request durations observed for m: %d, want 4", n)
	}
}
