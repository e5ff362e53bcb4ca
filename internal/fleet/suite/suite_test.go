package suite

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/loadmon"
)

// TestCostModelSuite runs the smallest suite that has every kind of row and checks that each
// figure is measured and the table marks it against its target.
func TestCostModelSuite(t *testing.T) {
	o := Options{
		Policy: "cache_aware", LoadMode: loadmon.ModeScaled, Base: fleet.DefaultConfig(),
		Workloads: []string{"multi-turn", "long-context"}, Shapes: []string{"4x8"},
		Timings: []engine.TimingModel{engine.TimingPerSlot}, Seeds: []uint64{3},
		Duration: 20 * time.Second, Warmup: 5 * time.Second,
	}
	o.Base.KVEvents = fleet.KVEvents{Delay: 5 * time.Millisecond, TokenizeBase: time.Millisecond, TokenizeTPS: 2e6}
	res, err := Run(context.Background(), "cost-model", o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || len(res.Splits) != 1 || len(res.Replicas) != 1 {
		t.Fatalf("%d grid, %d split, %d replica rows; want 2, 1, 1", len(res.Rows), len(res.Splits), len(res.Replicas))
	}
	for _, r := range res.Rows {
		if r.Timing != "per-slot" || r.Seed != 3 || !strings.HasSuffix(r.Name, " 4x8") {
			t.Errorf("row %+v: wrong case", r)
		}
		// The policy under test is cache_aware, one of the baselines: that ratio is exactly 1.
		if r.P99 <= 0 || r.OracleP99 <= 0 || r.P99Oracle1 <= 0 || r.P99Oracle8 <= 0 || r.MeanOracle1 <= 0 || r.P99CacheAware != 1 ||
			r.P99RoundRobin <= 0 || r.PreciseVsPolicy <= 0 || r.Hit8vs1 <= 0 || r.Spread == 0 {
			t.Errorf("row %s: a figure is missing: %+v", r.Name, r)
		}
	}
	if s := res.Splits[0]; s.HitEven <= 0 || s.HitSplit <= 0 || s.Ratio <= 0 {
		t.Errorf("split row %+v", s)
	}
	if p := res.Replicas[0]; p.P99One <= 0 || p.P99Two <= 0 || p.Timing != "per-slot" {
		t.Errorf("replica row %+v", p)
	}
	if len(res.Skipped) != 0 {
		t.Errorf("skipped %v", res.Skipped)
	}
	var b bytes.Buffer
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"multi-turn 4x8", "long-context 48x2000 4x8", "80/20÷even", "g2÷g1", "÷orc g1", "targets:", "columns:"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Policy: "nope"},
		{Policy: "cache_aware", Workloads: []string{"chess"}},
		{Policy: "cache_aware", Shapes: []string{"16x"}},
		{Policy: "cache_aware", Duration: time.Second, Warmup: 2 * time.Second},
		{Policy: "cache_aware", Hour: true},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", o)
		}
	}
	if _, err := Run(context.Background(), "speed", Options{Policy: "cache_aware"}); err == nil {
		t.Error("Run accepted an unknown suite")
	}
	o := Options{Policy: "cache_aware", Workloads: []string{"conversation", "agent"}, Shapes: []string{"8x"}, Seeds: []uint64{1}}
	cases, skipped, err := o.withDefaults().cases()
	if err != nil || len(skipped) != 1 || len(cases) != 2 || cases[0].name != "agent 0-15m 8x" {
		t.Fatalf("cases %d (first %q), skipped %v, %v", len(cases), cases[0].name, skipped, err)
	}
	// Per-slot rows run engines of Slots slots; batched rows keep the base's.
	if b, p := cases[0], cases[1]; b.timing != engine.TimingBatched || b.base.Engine.MaxRunning != 0 ||
		p.timing != engine.TimingPerSlot || p.base.Engine.MaxRunning != 8 {
		t.Errorf("max running: batched %d, per-slot %d", b.base.Engine.MaxRunning, p.base.Engine.MaxRunning)
	}
}
