package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/loadmon"
)

// TestOracleReachesIdeal: with no load pressure (requests far apart, so no queue anywhere) and
// caches that hold the working set, the oracle reaches the workload's ideal hit rate exactly;
// the prefix-tree policy, which sees only the routing prefix and places misses by load, does
// not do better.
func TestOracleReachesIdeal(t *testing.T) {
	g := bench.NewMooncakeGen(3)
	g.Duration, g.Rate, g.ContextTokens, g.TurnsMean, g.Think = 10*time.Minute, 0.2, 3000, 3, 20*time.Second
	// Spread arrivals at least 5 s apart: every request finishes before the next arrives.
	w, es := mooncakeWorkload(t, g, func(es []bench.MooncakeEntry) {
		for i := range es {
			es[i].Timestamp = float64(i) * 5000
		}
	})
	x := &Experiment{
		Base:     Config{Engines: 4},
		Policies: []string{OraclePolicy, "cache_aware"},
		Workload: w, Limits: bench.Limits{}, Seed: 1, Parallel: 1,
	}
	rows, err := x.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o, ca := rows[0], rows[1]
	if o.IdealHitRate <= 0.3 || o.IdealHitRate != ca.IdealHitRate {
		t.Fatalf("ideal %v / %v: want the same, well above zero", o.IdealHitRate, ca.IdealHitRate)
	}
	if o.HitRate != o.IdealHitRate {
		t.Fatalf("oracle hit %v, ideal %v", o.HitRate, o.IdealHitRate)
	}
	if ca.HitRate > o.HitRate || o.HitVsOracle != 1 || ca.HitVsOracle != round3(ca.HitRate/o.HitRate) {
		t.Fatalf("cache_aware %v (÷oracle %v) against oracle %v", ca.HitRate, ca.HitVsOracle, o.HitRate)
	}
	if o.Errors != 0 || o.OK != len(es) {
		t.Fatalf("oracle: %d ok, %d errors of %d", o.OK, o.Errors, len(es))
	}
}

// TestOracleSpreadsASharedOpening: every request shares its first block, under load; the oracle
// must not pile them onto the engine that holds it (the failure of hashing the opening).
func TestOracleSpreadsASharedOpening(t *testing.T) {
	g := bench.NewMooncakeGen(5)
	g.Duration, g.Rate, g.ContextTokens = 2*time.Minute, 4, 4000
	w, _ := mooncakeWorkload(t, g, nil)
	sched, err := bench.NewSchedule(w, bench.Arrivals{}, bench.Limits{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Run(context.Background(), Config{Engines: 4, Policy: OraclePolicy}, sched)
	if err != nil {
		t.Fatal(err)
	}
	if s.Spread <= 0 || s.Spread > 2 {
		t.Fatalf("oracle load spread %v on a shared opening", s.Spread)
	}
}

// TestDefaultPolicyOnSharedOpening: on Mooncake-format traffic where every request opens with
// the same block, the default policy keeps the load spread under 2 (hashing the opening drove it
// to 48) and at least 0.9 of the oracle's hit rate, at one gateway and at four.
func TestDefaultPolicyOnSharedOpening(t *testing.T) {
	g := bench.NewMooncakeGen(5)
	g.Duration, g.Rate, g.ContextTokens = 3*time.Minute, 3, 6000
	w, _ := mooncakeWorkload(t, g, nil)
	// The oracle reads the engines, not a gateway's view: one run of it is the reference for both
	// gateway counts.
	x := &Experiment{
		Base:     Config{Engines: 4, LoadMode: loadmon.ModeScaled},
		Policies: []string{"cache_aware_hash"},
		Gateways: []int{1, 4},
		Workload: w, Seed: 1, Parallel: 2,
	}
	rows, err := x.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sched, err := bench.NewSchedule(w, bench.Arrivals{}, bench.Limits{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	o, err := Run(context.Background(), Config{Engines: 4, Policy: OraclePolicy, Seed: 1}, sched)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		vs := r.HitRate / o.HitRate
		t.Logf("%s g=%d: hit %.3f (÷oracle %.3f), spread %.2f, TTFT p99 %.0f ms", r.Label, r.Gateways, r.HitRate, vs, r.Spread, r.TTFTP99)
		if r.Spread <= 0 || r.Spread >= 2 || vs < 0.9 {
			t.Errorf("%s at %d gateways: spread %v, hit %.3f of the oracle's", r.Label, r.Gateways, r.Spread, vs)
		}
	}
}

// mooncakeWorkload generates g's trace, lets edit change it (nil: as generated), and replays it
// as a workload.
func mooncakeWorkload(t *testing.T, g *bench.MooncakeGen, edit func([]bench.MooncakeEntry)) (*bench.Mooncake, []bench.MooncakeEntry) {
	t.Helper()
	es, err := g.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(es)
	}
	w, err := bench.NewMooncake(es, bench.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return w, es
}
