package fleet

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/flow"
)

// TestFlowModelAccountsEveryRequest runs an overloaded fleet with the queue on: every request is
// served or shed, the queue holds some, and TTFT includes the queue wait.
func TestFlowModelAccountsEveryRequest(t *testing.T) {
	w, _ := bench.NewWorkload("shared-prefix", 1)
	sched, err := bench.NewSchedule(w, bench.Arrivals{Rate: 400}, bench.Limits{Requests: 600}, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engines: 2, Policy: "round_robin", Flow: FlowModel{
		Config:  flow.Config{Enabled: true, Timeout: 2 * time.Second, Saturation: flow.Saturation{DefaultSlots: 8, MaxWaiting: -1}},
		Classes: []FlowClass{{Tenant: "a", Share: 3}, {Tenant: "b", Share: 1}},
	}}
	sum, rep, err := RunFlow(context.Background(), cfg, sched)
	if err != nil {
		t.Fatal(err)
	}
	shed := shedTotal(rep)
	if sum.OK+sum.Errors != 600 {
		t.Fatalf("%d requests recorded, want 600", sum.OK+sum.Errors)
	}
	if sum.Errors != shed {
		t.Errorf("errors %d, shed %d: a request was lost or failed otherwise", sum.Errors, shed)
	}
	if rep.MaxQueued == 0 {
		t.Error("the queue never held a request on an overloaded fleet")
	}
	var served int
	for _, c := range rep.Classes {
		served += c.Summary.OK
		if c.WaitMax <= 0 {
			t.Errorf("class %s never waited", c.Label)
		}
	}
	if served != sum.OK {
		t.Errorf("classes served %d, the run %d", served, sum.OK)
	}
	// Determinism: the same run gives the same result.
	sched2, _ := bench.NewSchedule(w, bench.Arrivals{Rate: 400}, bench.Limits{Requests: 600}, 1)
	sum2, _, _ := RunFlow(context.Background(), cfg, sched2)
	if sum2.TTFTP99 != sum.TTFTP99 || sum2.TTFTP50 != sum.TTFTP50 {
		t.Errorf("two runs differ: %v vs %v", sum.TTFTP99, sum2.TTFTP99)
	}
}

// TestFlowTables produces the flow-control tables of docs/benchmarks.md from the public
// conversation trace (KVGATE_FLOW_TRACE names it; the test is skipped without it):
//
//	KVGATE_FLOW_TRACE=mooncake-conversation.jsonl go test -run TestFlowTables -v -timeout 1h ./internal/fleet/
//
// KVGATE_FLOW_TO bounds the trace window (default 15m); KVGATE_FLOW_ONLY runs one table
// (latebinding, tenants or bands); KVGATE_FLOW_POLL sets the load-poll interval (default 1s);
// KVGATE_FLOW_WAIT, KVGATE_FLOW_KV and KVGATE_FLOW_WAITING the saturation point;
// KVGATE_FLOW_SEED the simulator's seed (default 1).
func TestFlowTables(t *testing.T) {
	path := os.Getenv("KVGATE_FLOW_TRACE")
	if path == "" {
		t.Skip("KVGATE_FLOW_TRACE is not set")
	}
	to := 15 * time.Minute
	if v := os.Getenv("KVGATE_FLOW_TO"); v != "" {
		to, _ = time.ParseDuration(v)
	}
	only := os.Getenv("KVGATE_FLOW_ONLY")
	poll := time.Second
	if v := os.Getenv("KVGATE_FLOW_POLL"); v != "" {
		poll, _ = time.ParseDuration(v)
	}
	seed := uint64(1)
	if v := os.Getenv("KVGATE_FLOW_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	runPolicy := func(pol string, scale float64, fm FlowModel) (bench.Summary, *FlowReport) {
		w, err := bench.LoadMooncake(path, bench.MooncakeOptions{TimeScale: scale, To: to})
		if err != nil {
			t.Fatal(err)
		}
		sched, err := bench.NewSchedule(w, bench.Arrivals{}, bench.Limits{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		sum, rep, err := RunFlow(context.Background(), Config{Engines: 8, Policy: pol, Flow: fm, Seed: seed, PollInterval: poll}, sched)
		if err != nil {
			t.Fatal(err)
		}
		return sum, rep
	}
	run := func(scale float64, fm FlowModel) (bench.Summary, *FlowReport) {
		return runPolicy("cache_aware_hash", scale, fm)
	}
	sat := flowSaturation()
	q := flow.Config{Enabled: true, Saturation: sat, Timeout: 60 * time.Second}
	unbounded := flow.Config{Enabled: true} // with OnArrival: the queue never holds
	if only == "" || only == "latebinding" {
		var b strings.Builder
		fmt.Fprintf(&b, "\n| rate | dispatch | TTFT p50 | TTFT p99 | own-prefill p99 | ideal-cache floor p99 | goodput (req/s, TTFT ≤ 2 s) | output tok/s | queue wait p50 / p99 | shed |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, row := range []struct {
			scale float64
			pol   string
		}{{1, "cache_aware_hash"}, {0.5, "cache_aware_hash"}, {1, OraclePolicy}} {
			for _, on := range []bool{false, true} {
				fm, name := FlowModel{Config: unbounded, OnArrival: true}, "on arrival"
				if on {
					fm, name = FlowModel{Config: q}, "late binding"
				}
				if row.pol == OraclePolicy {
					name += ", oracle"
				}
				scale := row.scale
				sum, rep := runPolicy(row.pol, scale, fm)
				wait := fmt.Sprintf("%.2f / %.2f s", rep.Classes[0].WaitP50, rep.Classes[0].WaitP99)
				shed := shedTotal(rep)
				fmt.Fprintf(&b, "| ×%g | %s | %.2f s | %.2f s | %.2f s | %.2f s | %.3f | %.0f | %s | %d |\n", 1/scale, name, sum.TTFTP50/1000, sum.TTFTP99/1000, rep.OwnPrefillP99, rep.IdealPrefillP99, float64(rep.Good)/sum.SpanSec, sum.OutTokSec, wait, shed)
			}
		}
		t.Log(b.String())
	}
	if only == "" || only == "tenants" {
		classes := []FlowClass{{Tenant: "noisy", Share: 10}, {Tenant: "quiet", Share: 1}}
		t.Log(classTable(run, "| run | tenant | TTFT p50 | TTFT p99 | queue wait p99 / max | share while both queued |", []flowRun{
			{"quiet alone", FlowModel{Config: q, Classes: classes, Only: classes[1].Label()}},
			{"both, on arrival", FlowModel{Config: unbounded, Classes: classes, OnArrival: true}},
			{"both, fair queue", FlowModel{Config: q, Classes: classes}},
			{"1:1, both backlogged", FlowModel{Config: q, Classes: []FlowClass{{Tenant: "a", Share: 1}, {Tenant: "b", Share: 1}}}},
		}, func(cr FlowClassReport, _ int) string {
			return fmt.Sprintf("%.2f / %.2f s | %.3f", cr.WaitP99, cr.WaitMax, cr.Share)
		}))
	}
	if only == "" || only == "bands" {
		classes := []FlowClass{{Tenant: "app", Priority: 5, Share: 1}, {Tenant: "app", Priority: 0, Share: 10}}
		t.Log(classTable(run, "| run | band | TTFT p50 | TTFT p99 | queue wait p50 / p99 / max | shed |", []flowRun{
			{"high alone", FlowModel{Config: q, Classes: classes, Only: classes[0].Label()}},
			{"both bands", FlowModel{Config: q, Classes: classes}},
		}, func(cr FlowClassReport, shed int) string {
			return fmt.Sprintf("%.2f / %.2f / %.2f s | %d", cr.WaitP50, cr.WaitP99, cr.WaitMax, shed)
		}))
	}
}

// flowRun is one named run of a table of TestFlowTables.
type flowRun struct {
	name string
	fm   FlowModel
}

// classTable runs each of runs at half the trace's rate and returns a Markdown table under
// header (six columns) with a row for each class that sent requests: the run, the class, its
// TTFT p50 and p99, then the last columns from rest, given the run's shed total.
func classTable(run func(float64, FlowModel) (bench.Summary, *FlowReport), header string, runs []flowRun, rest func(cr FlowClassReport, shed int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n|---|---|---|---|---|---|\n", header)
	for _, c := range runs {
		_, rep := run(0.5, c.fm)
		for _, cr := range rep.Classes {
			if cr.Summary.OK+cr.Summary.Errors == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f s | %.2f s | %s |\n", c.name, cr.Label, cr.Summary.TTFTP50/1000, cr.Summary.TTFTP99/1000, rest(cr, shedTotal(rep)))
		}
	}
	return b.String()
}

// shedTotal is how many requests left a queue unserved, for every reason.
func shedTotal(rep *FlowReport) int {
	n := 0
	for _, k := range rep.Shed {
		n += k
	}
	return n
}

// flowSaturation is the saturation point of the tables, from KVGATE_FLOW_WAIT (the predicted
// wait bound, default the package default) and KVGATE_FLOW_WAITING.
func flowSaturation() flow.Saturation {
	s := flow.DefaultSaturation()
	if v := os.Getenv("KVGATE_FLOW_WAIT"); v != "" {
		s.MaxPredictedWait, _ = time.ParseDuration(v)
	}
	if v := os.Getenv("KVGATE_FLOW_KV"); v != "" {
		s.MaxKVUsage, _ = strconv.ParseFloat(v, 64)
	}
	if v := os.Getenv("KVGATE_FLOW_WAITING"); v != "" {
		s.MaxWaiting, _ = strconv.ParseFloat(v, 64)
	}
	return s
}
