package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/policy"
)

func TestBenchFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"nothing to measure", []string{"--rate", "1", "--requests", "1"}, "--target URL (live) or --fleet"},
		{"both", []string{"--target", "http://127.0.0.1:1", "--fleet", "--rate", "1", "--requests", "1"}, "not both"},
		{"unknown workload", []string{"--target", "http://127.0.0.1:1", "--workload", "nope", "--rate", "1", "--requests", "1"}, "unknown workload"},
		{"no arrivals", []string{"--target", "http://127.0.0.1:1", "--requests", "1"}, "set a rate"},
		{"unbounded", []string{"--target", "http://127.0.0.1:1", "--rate", "1"}, "bound the run"},
		{"bad trace", []string{"--target", "http://127.0.0.1:1", "--trace", "/nonexistent/t.jsonl"}, "/nonexistent/t.jsonl"},
		{"bad api", []string{"--target", "http://127.0.0.1:1", "--api", "x", "--model", "m", "--rate", "1", "--requests", "1"}, "chat or completions"},
		{"stray arg", []string{"--target", "http://127.0.0.1:1", "extra"}, "unexpected argument"},
		{"bad flag", []string{"--rate", "fast"}, "invalid value"},
		{"unknown policy", []string{"--fleet", "--policies", "fastest", "--rate", "1", "--requests", "1"}, "unknown policy"},
		{"bad gateways", []string{"--fleet", "--gateways", "1,x", "--rate", "1", "--requests", "1"}, "not a positive count"},
		{"bad load mode", []string{"--fleet", "--load-modes", "psychic", "--rate", "1", "--requests", "1"}, "unknown load mode"},
		{"bad spread", []string{"--fleet", "--spread", "sideways", "--rate", "1", "--requests", "1"}, "unknown spread"},
		{"bad engine", []string{"--fleet", "--max-running", "-3", "--rate", "1", "--requests", "1"}, "max running"},
		{"bad trace format", []string{"--fleet", "--trace", "x.jsonl", "--trace-format", "csv"}, "want jsonl or mooncake"},
		{"bad engine mix", []string{"--fleet", "--engine-mix", "8", "--rate", "1", "--requests", "1"}, "COUNTxSPEED"},
		{"bad window", []string{"--fleet", "--workload", "mooncake-synth", "--from", "10m", "--to", "5m"}, "window"},
		{"sweep closed loop", []string{"--fleet", "--sweep", "--concurrency", "2", "--requests", "5"}, "--sweep needs --rate"},
		{"rate scale closed loop", []string{"--fleet", "--concurrency", "2", "--requests", "5", "--rate-scale", "2"}, "closed loop"},
		{"bad rate scale", []string{"--fleet", "--rate", "1", "--requests", "5", "--rate-scale", "0"}, "--rate-scale"},
		{"bad split", []string{"--fleet", "--rate", "1", "--requests", "5", "--gateways", "2", "--gateway-splits", "80/x"}, "gateway split"},
		{"split without its gateways", []string{"--fleet", "--rate", "1", "--requests", "5", "--gateway-splits", "80/20"}, "needs a run at 2 gateways"},
		{"bad timing", []string{"--fleet", "--rate", "1", "--requests", "5", "--engine-timing", "chunked"}, "engine timing"},
		{"suite without fleet", []string{"--suite", "cost-model"}, "add --fleet"},
		{"unknown suite", []string{"--fleet", "--suite", "speed"}, "unknown suite"},
		{"suite seeds", []string{"--fleet", "--suite", "cost-model", "--suite-seeds", "x"}, "--suite-seeds"},
		{"suite timings", []string{"--fleet", "--suite", "cost-model", "--suite-timings", "fast"}, "--suite-timings"},
		{"suite jsonl trace", []string{"--fleet", "--suite", "cost-model", "--trace", "t.jsonl"}, "--trace-format mooncake"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), append([]string{"bench"}, tc.args...), &out, &errb)
			if err == nil {
				t.Fatal("want an error")
			}
			if msg := err.Error() + errb.String(); !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want one containing %q", msg, tc.want)
			}
		})
	}
}

func TestBenchFleetWritesReportAndCharts(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"bench", "--fleet", "--engines", "2", "--gateways", "1,2", "--policies", "round_robin,cache_aware",
		"--rate", "5", "--duration", "20s", "--out", dir}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"round_robin", "cache_aware", "shared-prefix"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	for _, f := range []string{"report.json", "report.txt", "ttft-cdf.png", "hit-vs-gateways.png", "p99-vs-gateways.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
}

// TestBenchMooncakeReplay: a Mooncake-format trace written by the generator replays through the
// flags, window and cap included, with the oracle's row as the reference.
func TestBenchMooncakeReplay(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "mc.jsonl")
	var out, errb bytes.Buffer
	args := []string{"bench", "--fleet", "--workload", "mooncake-synth", "--gen-duration", "40s", "--gen-context-tokens", "2000",
		"--duration", "40s", "--trace-out", trace, "--policies", "round_robin", "--engines", "2"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	out.Reset()
	args = []string{"bench", "--fleet", "--trace", trace, "--trace-format", "mooncake", "--from", "5s", "--to", "35s",
		"--time-scale", "0.5", "--requests", "40", "--policies", "cache_aware_hash,oracle", "--engines", "2", "--json"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{`"workload": "mooncake"`, `"policy": "oracle"`, `"ideal_hit_rate"`, `"hit_vs_oracle"`, `"ok": 40,`} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report lacks %s:\n%s", want, out.String())
		}
	}
}

// TestBenchWritesAgentTrace: --trace-out without an instrument writes the generated trace and
// prints its measured shape; the file replays.
func TestBenchWritesAgentTrace(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "agent.jsonl")
	var out, errb bytes.Buffer
	args := []string{"bench", "--workload", "mooncake-agent", "--gen-duration", "2m", "--trace-out", trace}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), "0 blocks shared by all") || !strings.Contains(out.String(), "ideal reuse") {
		t.Fatalf("shape line %q", out.String())
	}
	out.Reset()
	args = []string{"bench", "--fleet", "--trace", trace, "--trace-format", "mooncake", "--requests", "30",
		"--policies", "round_robin", "--engines", "2", "--json"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if !strings.Contains(out.String(), `"ok": 30,`) {
		t.Fatalf("replay report:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"bench", "--workload", "multi-turn", "--trace-out", trace}, &out, &errb); err == nil ||
		!strings.Contains(err.Error(), "generated trace") {
		t.Fatalf("--trace-out of a non-trace workload: %v", err)
	}
}

// TestBenchFleetDefaults: with no --policies and --load-modes a fleet run measures the gateway's
// own defaults; --rate-scale doubles the offered rate; a split runs beside the even one.
func TestBenchFleetDefaults(t *testing.T) {
	defPolicy, defMode := gatewayDefaults()
	var o serveOptions
	if err := newServeFlags(&o, io.Discard).Parse(nil); err != nil || o.policyName != defPolicy || o.loadMonMode != defMode {
		t.Fatalf("serve defaults %q/%q, bench defaults %q/%q (%v)", o.policyName, o.loadMonMode, defPolicy, defMode, err)
	}
	var out, errb bytes.Buffer
	args := []string{"bench", "--fleet", "--engines", "2", "--rate", "2", "--rate-scale", "2", "--duration", "10s",
		"--gateways", "2", "--gateway-splits", "even,80/20", "--json"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var rep struct {
		Rows []struct {
			Label, Policy, LoadMode, Arrivals, Split string `json:",omitempty"`
		}
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("%d rows, want the even split and 80/20:\n%s", len(rep.Rows), out.String())
	}
	for i, r := range rep.Rows {
		if p, _ := policy.Canonical(defPolicy); r.Policy != p || !strings.Contains(r.Arrivals, "4") {
			t.Errorf("row %d: policy %q (want %q), arrivals %q (want rate 4)", i, r.Policy, p, r.Arrivals)
		}
	}
	if rep.Rows[0].Split != "" || rep.Rows[1].Split != "80/20" || !strings.Contains(rep.Rows[1].Label, "split 80/20") {
		t.Errorf("splits %+v", rep.Rows)
	}
}

// TestBenchSuite: --suite prints the target table of the rows it is given.
func TestBenchSuite(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"bench", "--fleet", "--suite", "cost-model", "--suite-workloads", "multi-turn", "--suite-shapes", "4x8",
		"--suite-timings", "per-slot", "--suite-seeds", "2", "--duration", "10s", "--warmup", "2s"}
	if err := run(context.Background(), args, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"multi-turn 4x8  per-slot     2", "80/20÷even", "targets:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("suite table lacks %q:\n%s", want, out.String())
		}
	}
	if errb.Len() != 0 {
		t.Errorf("progress written to a buffer, not a terminal: %q", errb.String())
	}
}

// TestProgressOnlyOnATerminal: progress is drawn on a terminal, never into a file or a buffer.
func TestProgressOnlyOnATerminal(t *testing.T) {
	fh, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if progressTo(fh) || progressTo(&bytes.Buffer{}) {
		t.Fatal("progress would be drawn into a file or a buffer")
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !progressTo(tty) {
			t.Error("no progress on a terminal")
		}
	}
}

// TestGeneratorFlagsOverWorkloadDefaults: the --gen-* flags given replace --workload's own
// generator defaults (mooncake-agent's here), and the others keep them, whatever the flags'
// registered defaults (mooncake-synth's).
func TestGeneratorFlagsOverWorkloadDefaults(t *testing.T) {
	var f benchFlags
	fs := newBenchFlagSet(&f, io.Discard)
	if err := parseFlags(fs, []string{"--workload", "mooncake-agent", "--gen-duration", "90s", "--gen-rate", "0.125", "--gen-think", "1m30s"}); err != nil {
		t.Fatal(err)
	}
	fs.Visit(func(fl *flag.Flag) { f.set = append(f.set, fl.Name) })
	got, agent := f.generator(), *bench.DefaultGenerator("mooncake-agent", f.seed)
	want := agent
	want.Duration, want.Rate, want.Think, want.BlockTokens = 90*time.Second, 0.125, 90*time.Second, f.blockTokens
	if got != want {
		t.Fatalf("generator %+v\nwant      %+v", got, want)
	}
	if agent.ContextTokens == bench.NewMooncakeGen(0).ContextTokens {
		t.Fatal("the agent's context default is the synth's: the test cannot tell them apart")
	}
}
