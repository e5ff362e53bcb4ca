package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
)

func TestParseEngineMix(t *testing.T) {
	mix, err := ParseEngineMix("6x1, 2x0.5:0.25")
	if err != nil {
		t.Fatal(err)
	}
	if len(mix) != 2 || mix[0] != (EngineClass{6, 1, 1}) || mix[1] != (EngineClass{2, 0.5, 0.25}) {
		t.Fatalf("parsed %+v", mix)
	}
	for _, bad := range []string{"", "6", "x1", "0x1", "6x0", "6x1:0", "6x1:abc", "6xNaN", "5000x1"} {
		if _, err := ParseEngineMix(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c := Config{EngineMix: mix, Engine: engine.Config{PrefillTPS: 1000}}
	slow, fast := c.engineConfig(7), c.engineConfig(0)
	d := engine.DefaultConfig()
	if fast.PrefillTPS != 1000 || slow.PrefillTPS != 500 || slow.DecodeBase != 2*d.DecodeBase || slow.KVTokens != d.KVTokens/4 {
		t.Fatalf("fast %+v, slow %+v", fast, slow)
	}
	if err := (Config{Engines: 4, EngineMix: mix}).Validate(); err == nil {
		t.Error("a mix of 8 engines accepted for a fleet of 4")
	}
}

// TestEngineMixSlowsHalfTheFleet: the same requests, round robin, on a fleet where half the
// engines are half as fast: TTFT grows, and the oracle, which judges wait by each engine's own
// prefill rate, sends the slow engines less work.
func TestEngineMixSlowsHalfTheFleet(t *testing.T) {
	w := bench.NewLongContext(1)
	run := func(pol string, mix []EngineClass) bench.Summary {
		sched, err := bench.NewSchedule(w, bench.Arrivals{Rate: 6}, bench.Limits{Duration: 40 * time.Second}, 1)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Run(context.Background(), Config{Engines: 4, EngineMix: mix, Policy: pol}, sched)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	mix := []EngineClass{{2, 1, 1}, {2, 0.5, 1}}
	even, mixed := run("round_robin", nil), run("round_robin", mix)
	if !(mixed.TTFTMean > even.TTFTMean*1.2) {
		t.Fatalf("round robin TTFT mean: %v on a mixed fleet, %v on an even one", mixed.TTFTMean, even.TTFTMean)
	}
	if o := run(OraclePolicy, mix); !(o.TTFTMean < mixed.TTFTMean) {
		t.Fatalf("oracle TTFT mean %v not below round robin's %v on the mixed fleet", o.TTFTMean, mixed.TTFTMean)
	}
}

func TestGatewaySplits(t *testing.T) {
	sp, err := ParseSplit("80/20")
	if err != nil || len(sp) != 2 || sp[0] != 80 || FormatSplit(sp) != "80/20" {
		t.Fatalf("ParseSplit(80/20) = %v, %v", sp, err)
	}
	if sp, err := ParseSplit("even"); err != nil || sp != nil || FormatSplit(sp) != "even" {
		t.Fatalf("ParseSplit(even) = %v, %v", sp, err)
	}
	for _, bad := range []string{"80/x", "0/1", "-1/2", "1e9/1", "NaN/1"} {
		if _, err := ParseSplit(bad); err == nil {
			t.Errorf("ParseSplit(%q) accepted", bad)
		}
	}
	s := &sim{cfg: Config{GatewayWeights: []float64{80, 20}}}
	for u, want := range map[float64]int{0: 0, 0.79: 0, 0.8: 1, 0.999: 1} {
		if got := s.weightedGateway(u); got != want {
			t.Errorf("weightedGateway(%v) = %d, want %d", u, got, want)
		}
	}
	x := &Experiment{Gateways: []int{1, 2}, Splits: [][]float64{nil, {80, 20}}}
	var got []string
	for _, c := range x.Configs() {
		got = append(got, fmt.Sprint(c.Gateways, " ", FormatSplit(c.GatewayWeights)))
	}
	if want := []string{"1 even", "2 even", "2 80/20"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("grid %v, want %v", got, want)
	}
	if err := (Config{Gateways: 3, GatewayWeights: []float64{1, 2}}).Validate(); err == nil {
		t.Error("Validate accepted 2 weights for 3 gateways")
	}
}
