// Package suite runs named sets of fleet experiments and prints their target tables. The
// cost-model suite measures one policy (the gateway's default) on every workload, fleet shape,
// engine timing model and seed that the routing targets name, each row a grid run against the
// oracle and the baselines in the same process, so every figure is a ratio measured side by side
// on the same requests.
package suite

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
)

// Names lists the suites Run knows.
var Names = []string{"cost-model"}

// Workloads are the row workloads of the cost-model suite: the public conversation trace (when
// Options.Trace names it), the generated agent trace, and the synthetic workloads.
var Workloads = []string{"conversation", "agent", "shared-prefix", "multi-turn", "long-context"}

// Shapes are the fleet shapes of the cost-model suite: 8 engines at the simulator defaults, 4
// engines of 8 slots (at half the rate, the same load per engine), 8 engines of which a quarter
// are half as fast, 8 engines with a quarter of the KV cache, and 8 engines at twice the rate.
var Shapes = []string{"8x", "4x8", "mixed", "quarter-cache", "2x-rate"}

// Options configure a suite run. Zero fields take the defaults in their docs.
type Options struct {
	// Policy is the policy under test; LoadMode the load signal every policy reads. Both
	// required (the CLI passes the gateway's defaults).
	Policy   string
	LoadMode loadmon.Mode
	// Base is the fleet configuration every row starts from (policy knobs, polls, engine costs,
	// KV events); the suite sets its shape, policies and gateway counts.
	Base fleet.Config
	// Trace is the Mooncake-format conversation trace file; without it the conversation rows
	// are skipped.
	Trace string
	// Window is how much trace time the trace rows replay from the start. Default 15 min.
	Window time.Duration
	// Hour adds rows that replay the whole conversation trace.
	Hour bool
	// Duration and Warmup bound the synthetic rows in virtual time. Default 120 s and 30 s.
	Duration, Warmup time.Duration
	// Workloads, Shapes, Timings and Seeds select the rows; empty means every workload and
	// shape, both timing models and seeds 1 and 2.
	Workloads []string
	Shapes    []string
	Timings   []engine.TimingModel
	Seeds     []uint64
	// Slots is the running requests per engine of the per-slot rows whose shape does not set
	// them: a per-slot engine with hundreds of slots of its own never queues, so the rows use
	// llm-d-inference-sim's scale (its live runs used 8). Default 8.
	Slots int
	// Parallel is how many simulations run at once (zero: GOMAXPROCS).
	Parallel int
	// Progress, when set, gets a line as each row starts.
	Progress io.Writer
}

func (o Options) withDefaults() Options {
	o.Window = cmp.Or(o.Window, 15*time.Minute)
	o.Slots = cmp.Or(o.Slots, 8)
	o.Duration = cmp.Or(o.Duration, 120*time.Second)
	o.Warmup = cmp.Or(o.Warmup, 30*time.Second)
	if len(o.Workloads) == 0 {
		o.Workloads = Workloads
	}
	if len(o.Shapes) == 0 {
		o.Shapes = Shapes
	}
	if len(o.Timings) == 0 {
		o.Timings = []engine.TimingModel{engine.TimingBatched, engine.TimingPerSlot}
	}
	if len(o.Seeds) == 0 {
		o.Seeds = []uint64{1, 2}
	}
	return o
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	o = o.withDefaults()
	if _, err := policy.Canonical(o.Policy); err != nil {
		return fmt.Errorf("suite: %w", err)
	}
	for _, w := range o.Workloads {
		if !slices.Contains(Workloads, w) {
			return fmt.Errorf("suite: unknown workload %q (want %s)", w, strings.Join(Workloads, ", "))
		}
	}
	for _, s := range o.Shapes {
		if !slices.Contains(Shapes, s) {
			return fmt.Errorf("suite: unknown shape %q (want %s)", s, strings.Join(Shapes, ", "))
		}
	}
	switch {
	case o.Slots < 0 || o.Slots > 1<<16:
		return fmt.Errorf("suite: slots %d must be in [0, 65536]", o.Slots)
	case o.Window < 0 || o.Duration < 0 || o.Warmup < 0:
		return errors.New("suite: window, duration and warmup must be >= 0")
	case o.Warmup >= o.Duration:
		return fmt.Errorf("suite: warmup %v must be shorter than the duration %v", o.Warmup, o.Duration)
	case o.Hour && o.Trace == "":
		return errors.New("suite: whole-hour rows need the conversation trace")
	}
	return nil
}

// Result is a suite's measurements.
type Result struct {
	// Policy is the policy under test (canonical name).
	Policy string `json:"policy"`
	// Rows are the grid rows; Splits the uneven-split rows; Replicas the two-replica rows.
	Rows     []Row      `json:"rows"`
	Splits   []SplitRow `json:"splits,omitempty"`
	Replicas []PairRow  `json:"replicas,omitempty"`
	// Skipped says which rows were left out and why.
	Skipped []string `json:"skipped,omitempty"`
}

// Run runs the named suite.
func Run(ctx context.Context, name string, o Options) (*Result, error) {
	if name != "cost-model" {
		return nil, fmt.Errorf("suite: unknown suite %q (want %s)", name, strings.Join(Names, ", "))
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	pol, _ := policy.Canonical(o.Policy)
	res := &Result{Policy: pol}
	cases, skipped, err := o.cases()
	if err != nil {
		return nil, err
	}
	res.Skipped = skipped
	for i, c := range cases {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "suite %s: row %d of %d: %s, %s timing, seed %d\n", name, i+1, len(cases), c.name, c.timing, c.seed)
		}
		if err := o.runCase(ctx, pol, c, res); err != nil {
			return nil, fmt.Errorf("suite row %s (%s, seed %d): %w", c.name, c.timing, c.seed, err)
		}
	}
	return res, nil
}
