package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// metricName matches the metric names a PromQL expression can use from kvgate's registry.
var metricName = regexp.MustCompile(`\b(?:kvgate|process|go)_[a-z0-9_]+`)

// dashboardExprs returns every query of the dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("grafana/kvgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && strings.Contains(q, "kvgate_") {
			out = append(out, q)
		}
	}
	return out
}

// registered reports whether reg holds a metric called name: registering a probe descriptor of
// that name fails exactly when one is (with other help text, the registry refuses it).
func registered(reg *prometheus.Registry, name string) bool {
	probe := probeCollector{prometheus.NewDesc(name, "dashboard probe", nil, nil)}
	if err := reg.Register(probe); err != nil {
		return true
	}
	reg.Unregister(probe)
	return false
}

type probeCollector struct{ d *prometheus.Desc }

func (p probeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- p.d }
func (p probeCollector) Collect(chan<- prometheus.Metric)    {}

// Every query in the dashboard names metrics the gateway really registers.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	reg := worker.NewRegistry()
	mon := loadmon.New(reg, loadmon.DefaultConfig())
	defer mon.Stop()
	router, err := policy.NewRouter("cache_aware_hash", policy.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	gw := gateway.New(gateway.DefaultConfig(), reg, router, mon)
	promReg := gw.Metrics().Registry()
	if registered(promReg, "kvgate_no_such_metric") {
		t.Fatal("the probe finds a metric that does not exist")
	}
	var seen []string
	for _, expr := range dashboardExprs(t) {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("query names no metric: %s", expr)
		}
		for _, n := range names {
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suf); ok && registered(promReg, b) {
					base = b
				}
			}
			if !registered(promReg, base) {
				t.Errorf("the dashboard queries %s, which the gateway does not export (in %s)", n, expr)
			}
			seen = append(seen, base)
		}
	}
	for _, want := range []string{"kvgate_requests_total", "kvgate_ttft_seconds", "kvgate_request_duration_seconds",
		"kvgate_policy_decisions_total", "kvgate_worker_effective_load", "kvgate_worker_reported_backlog",
		"kvgate_worker_circuit_state", "kvgate_worker_health", "kvgate_policy_tree_chars", "kvgate_worker_load_report_age_seconds",
		"kvgate_pool_saturation", "kvgate_queue_requests", "kvgate_queue_wait_seconds", "kvgate_queue_shed_total",
		"kvgate_prefix_prediction_bias", "kvgate_prefix_tree_capacity_tokens", "kvgate_kv_index_drifting",
		"kvgate_worker_prefill_rate_tokens_per_second"} {
		if !slices.Contains(seen, want) {
			t.Errorf("the dashboard shows nothing of %s", want)
		}
	}
}

// dashboardVar is one templating variable of the dashboard.
type dashboardVar struct {
	Name, Type string
	Current    struct {
		Value string `json:"value"`
	} `json:"current"`
}

// The dashboard imports through Grafana's UI with a data-source prompt (__inputs: every
// ${DS_PROMETHEUS} in the file becomes the chosen source), and provisioned from a file as it is:
// the panels query the ${datasource} variable, whose default is that input, so a provisioned
// copy (never substituted) falls back to the default Prometheus instead of a missing source.
func TestDashboardImportPrompt(t *testing.T) {
	raw, err := os.ReadFile("grafana/kvgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Inputs []struct {
			Name, Type, PluginID string
		} `json:"__inputs"`
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				Type, UID string
			} `json:"datasource"`
			Targets []struct {
				Datasource struct {
					Type, UID string
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []dashboardVar `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" {
		t.Fatalf("__inputs: got %+v, want one Prometheus data-source input DS_PROMETHEUS", d.Inputs)
	}
	i := slices.IndexFunc(d.Templating.List, func(v dashboardVar) bool { return v.Name == "datasource" })
	if i < 0 || d.Templating.List[i].Type != "datasource" || d.Templating.List[i].Current.Value != "${DS_PROMETHEUS}" {
		t.Fatal("want a datasource variable defaulting to ${DS_PROMETHEUS}")
	}
	for _, p := range d.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q queries %q, not the ${datasource} variable", p.Title, p.Datasource.UID)
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a query on %q, not the ${datasource} variable", p.Title, tg.Datasource.UID)
			}
		}
	}
	// Every ${DS_...} placeholder is one Grafana will prompt for.
	for _, m := range regexp.MustCompile(`\$\{(DS_[A-Z_]+)\}`).FindAllStringSubmatch(string(raw), -1) {
		if m[1] != "DS_PROMETHEUS" {
			t.Errorf("placeholder %s has no __inputs entry", m[0])
		}
	}
}
