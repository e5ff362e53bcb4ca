package suite

import (
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
)

// caseKind says what a case measures.
type caseKind uint8

const (
	// gridCase: the policy, the oracle and the baselines at 1 and 8 gateways.
	gridCase caseKind = iota
	// splitCase: the policy at 2 gateways, split evenly and 80/20.
	splitCase
	// replicaCase: the policy at 1 and 2 gateways.
	replicaCase
)

// Baselines are the policies every grid row compares the policy under test with, besides the
// oracle.
var Baselines = []string{"round_robin", "cache_aware", "precise_prefix"}

// caseSpec is one row to run.
type caseSpec struct {
	kind     caseKind
	name     string
	workload string
	shape    string
	timing   engine.TimingModel
	seed     uint64
	spec     bench.Spec
	arr      bench.Arrivals
	lim      bench.Limits
	base     fleet.Config
}

// rates are the open-loop rates of the synthetic workloads on 8 engines (docs/routing.md's).
var rates = map[string]float64{"shared-prefix": 300, "multi-turn": 8, "long-context": 12}

// cases lists the rows the options select, in report order, and the rows skipped.
func (o Options) cases() (out []caseSpec, skipped []string, err error) {
	for _, wl := range o.Workloads {
		if wl == "conversation" && o.Trace == "" {
			skipped = append(skipped, "conversation: no trace file (--trace FILE --trace-format mooncake)")
			continue
		}
		windows := []time.Duration{o.Window}
		if o.Hour && (wl == "conversation" || wl == "agent") {
			windows = append(windows, 0)
		}
		for _, win := range windows {
			for _, shape := range o.Shapes {
				for _, tm := range o.Timings {
					for _, seed := range o.Seeds {
						c, err := o.gridCase(wl, win, shape, tm, seed)
						if err != nil {
							return nil, nil, err
						}
						out = append(out, c)
					}
				}
			}
		}
	}
	for _, wl := range []string{"multi-turn", "conversation"} {
		if !contains(o.Workloads, wl) || (wl == "conversation" && o.Trace == "") {
			continue
		}
		for _, seed := range o.Seeds {
			c, err := o.gridCase(wl, o.Window, "8x", engine.TimingBatched, seed)
			if err != nil {
				return nil, nil, err
			}
			c.kind = splitCase
			out = append(out, c)
		}
	}
	if contains(o.Workloads, "long-context") {
		for _, seed := range o.Seeds {
			out = append(out, o.replicaCase(seed))
		}
	}
	return out, skipped, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// gridCase builds the row of workload wl (trace rows replay [0, win) of trace time, all of it
// when win is 0) on the named shape.
func (o Options) gridCase(wl string, win time.Duration, shape string, tm engine.TimingModel, seed uint64) (caseSpec, error) {
	c := caseSpec{workload: wl, shape: shape, timing: tm, seed: seed, base: o.Base}
	c.base.EngineMix, c.base.GatewayWeights = nil, nil // the shape says
	c.base.Engine.Timing = tm
	if tm == engine.TimingPerSlot {
		c.base.Engine.MaxRunning = o.Slots
	}
	c.base.LoadMode = o.LoadMode
	rate := rates[wl]
	switch wl {
	case "conversation":
		c.spec = bench.Spec{Trace: o.Trace, TraceFormat: "mooncake", Mooncake: bench.MooncakeOptions{To: win}}
	case "agent":
		c.spec = bench.Spec{Name: "mooncake-agent", Mooncake: bench.MooncakeOptions{To: win}}
	default:
		c.spec = bench.Spec{Name: wl}
		c.lim = bench.Limits{Duration: o.Duration, Warmup: o.Warmup}
	}
	c.spec.Seed = seed
	scale := 1.0
	e := c.base.Engine.WithDefaults()
	switch shape {
	case "8x":
		c.base.Engines = 8
	case "4x8":
		c.base.Engines, c.base.Engine.MaxRunning, scale = 4, 8, 0.5
	case "mixed":
		c.base.Engines = 8
		c.base.EngineMix = []fleet.EngineClass{{Count: 6, Speed: 1, KV: 1}, {Count: 2, Speed: 0.5, KV: 1}}
	case "quarter-cache":
		c.base.Engines, c.base.Engine.KVTokens = 8, e.KVTokens/4
	case "2x-rate":
		c.base.Engines, scale = 8, 2
	default:
		return c, fmt.Errorf("unknown shape %q", shape)
	}
	if rate > 0 {
		c.arr = bench.Arrivals{Rate: rate * scale}
	} else {
		c.arr = bench.Arrivals{Speedup: scale}
	}
	c.name = wl
	if wl == "conversation" || wl == "agent" {
		if win > 0 {
			c.name += fmt.Sprintf(" 0-%v", shortDuration(win))
		} else {
			c.name += " all"
		}
	}
	c.name += " " + shape
	return c, nil
}

// replicaCase is long-context with 48 tenants of 2,000 words at 16 req/s on 4 engines of 8
// slots under the per-slot timing model: the shape of the live llm-d-inference-sim runs, with
// their caches (32,768 tokens each) and timing (1,000 prefill tokens/s, 10 ms prefill overhead,
// 5 ms decode steps). The 48 contexts fill 96k of the fleet's 128k cached tokens: they fit once,
// not twice, so two replicas that each place a context on a different engine overflow the
// caches (the live gap). The row runs 1 and 2 replicas, and 2 sharing their decisions over
// the replica sync plane (1 ms bus).
func (o Options) replicaCase(seed uint64) caseSpec {
	c := caseSpec{kind: replicaCase, name: "long-context 48x2000 4x8", workload: "long-context", shape: "4x8",
		timing: engine.TimingPerSlot, seed: seed, base: o.Base}
	c.base.EngineMix, c.base.GatewayWeights = nil, nil
	c.base.Engines, c.base.Engine.MaxRunning, c.base.Engine.Timing, c.base.LoadMode = 4, 8, engine.TimingPerSlot, o.LoadMode
	c.base.Engine.KVTokens, c.base.Engine.PrefillTPS, c.base.Engine.PrefillOverhead = 32768, 1000, 10*time.Millisecond
	c.base.Engine.DecodeBase, c.base.Engine.DecodePerReq = 5*time.Millisecond, 0
	c.spec = bench.Spec{Name: "long-context", Prefixes: 48, PrefixWords: 2000, Seed: seed}
	c.arr = bench.Arrivals{Rate: 16}
	c.lim = bench.Limits{Duration: o.Duration, Warmup: o.Warmup}
	return c
}

// shortDuration prints 15m0s as 15m and 1h0m0s as 1h.
func shortDuration(d time.Duration) string {
	s := d.String()
	for _, suf := range []string{"m0s", "h0m"} {
		if len(s) > len(suf) && s[len(s)-len(suf):] == suf {
			s = s[:len(s)-len(suf)+1]
		}
	}
	return s
}

// runCase runs one row and adds its result to res.
func (o Options) runCase(ctx context.Context, pol string, c caseSpec, res *Result) error {
	w, err := c.spec.Build()
	if err != nil {
		return err
	}
	x := &fleet.Experiment{Base: c.base, Workload: w, Arrivals: c.arr, Limits: c.lim, Seed: c.seed, Parallel: o.Parallel}
	switch c.kind {
	case gridCase:
		x.Policies = append([]string{pol, fleet.OraclePolicy}, Baselines...)
		x.Gateways = []int{1, 8}
	case splitCase:
		x.Policies, x.Gateways, x.Splits = []string{pol}, []int{2}, [][]float64{nil, {80, 20}}
	case replicaCase:
		x.Policies, x.Gateways = []string{pol}, []int{1, 2}
	}
	rows, err := x.Run(ctx)
	if err != nil {
		return err
	}
	t := table(rows)
	switch c.kind {
	case gridCase:
		res.Rows = append(res.Rows, gridRow(c, pol, t))
	case splitCase:
		even, split := t.get(pol, 2, ""), t.get(pol, 2, "80/20")
		res.Splits = append(res.Splits, SplitRow{Name: c.name, Seed: c.seed, HitEven: even.HitRate, HitSplit: split.HitRate,
			Ratio: ratio(split.HitRate, even.HitRate)})
	case replicaCase:
		one, two := t.get(pol, 1, ""), t.get(pol, 2, "")
		xs := *x
		xs.Base.Sync = fleet.SyncModel{Enabled: true, Delay: time.Millisecond}
		xs.Gateways = []int{2}
		synced, err := xs.Run(ctx)
		if err != nil {
			return err
		}
		sy := table(synced).get(pol, 2, "")
		res.Replicas = append(res.Replicas, PairRow{Name: c.name, Timing: c.timing.String(), Seed: c.seed,
			P99One: one.TTFTP99, P99Two: two.TTFTP99, Ratio: ratio(two.TTFTP99, one.TTFTP99),
			P99Sync: sy.TTFTP99, RatioSync: ratio(sy.TTFTP99, one.TTFTP99)})
	}
	return nil
}
