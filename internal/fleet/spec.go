package fleet

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
)

// GridSpec describes a grid of fleet runs in the words an operator writes them (names and
// comma-separated lists, as `kvgate bench --fleet` takes them); Build checks and resolves it
// into an Experiment. Each list field must name at least one value.
type GridSpec struct {
	// Base is the configuration every run starts from; the grid sets its Policy, Gateways,
	// LoadMode and GatewayWeights, and the fields below its Spread, EngineMix and Engine.Timing.
	Base Config
	// Policies are policy names or aliases, "all" (every policy) or OraclePolicy.
	Policies string
	// Gateways are replica counts, each at least 1.
	Gateways string
	// LoadModes are load-mode names (loadmon.ParseMode).
	LoadModes string
	// Splits are traffic splits over the gateways (ParseSplit); "" is the even split alone.
	Splits string
	// EngineMix, when set, makes the fleet heterogeneous (ParseEngineMix) and sets the engine
	// count.
	EngineMix string
	// Spread is how requests reach gateways: "uniform" ("") or "session".
	Spread string
	// Timing is the engines' timing model (engine.ParseTimingModel); "" is batched.
	Timing string
	// Parallel is how many runs go at once (zero: GOMAXPROCS).
	Parallel int
}

// Build returns the experiment of the grid on workload w under arr and lim, seeded with seed.
// Errors name the field (as the flag that sets it).
func (g GridSpec) Build(w bench.Workload, arr bench.Arrivals, lim bench.Limits, seed uint64) (*Experiment, error) {
	x := &Experiment{Base: g.Base, Workload: w, Arrivals: arr, Limits: lim, Seed: seed, Parallel: g.Parallel}
	x.Base.Seed = seed
	var err error
	if x.Base.Spread, err = ParseSpread(g.Spread); err != nil {
		return nil, err
	}
	if x.Base.Engine.Timing, err = engine.ParseTimingModel(g.Timing); err != nil {
		return nil, fmt.Errorf("engine timing: %w", err)
	}
	if g.EngineMix != "" {
		if x.Base.EngineMix, err = ParseEngineMix(g.EngineMix); err != nil {
			return nil, fmt.Errorf("engine mix: %w", err)
		}
		x.Base.Engines = 0
	} else if x.Base.Engines < 1 {
		return nil, fmt.Errorf("engines %d must be at least 1", x.Base.Engines)
	}
	if g.Parallel < 0 {
		return nil, fmt.Errorf("parallel %d must be >= 0", g.Parallel)
	}
	for _, p := range list(g.Policies) {
		if p == "all" {
			x.Policies = append(x.Policies, policy.Names()...)
			continue
		}
		if _, err := canonical(p); err != nil {
			return nil, fmt.Errorf("policies: %w", err)
		}
		x.Policies = append(x.Policies, p)
	}
	for _, s := range list(g.Gateways) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("gateways: %q is not a positive count", s)
		}
		x.Gateways = append(x.Gateways, n)
	}
	for _, s := range list(g.LoadModes) {
		m, err := loadmon.ParseMode(s)
		if err != nil {
			return nil, fmt.Errorf("load modes: %w", err)
		}
		x.Modes = append(x.Modes, m)
	}
	for _, s := range list(g.Splits) {
		sp, err := ParseSplit(s)
		if err != nil {
			return nil, fmt.Errorf("gateway splits: %w", err)
		}
		x.Splits = append(x.Splits, sp)
	}
	if len(x.Policies) == 0 || len(x.Gateways) == 0 || len(x.Modes) == 0 {
		return nil, errors.New("policies, gateways and load modes must each name at least one value")
	}
	x.Base.Policy, x.Base.Gateways, x.Base.LoadMode = x.Policies[0], x.Gateways[0], x.Modes[0]
	return x, x.Validate()
}

// Title says what the experiment runs, for a report: workload, arrivals, engines (their mix
// and timing model when not the default), spread and seed.
func (x *Experiment) Title() string {
	engines := fmt.Sprintf("%d engines", x.Base.withDefaults().Engines)
	if len(x.Base.EngineMix) > 0 {
		var parts []string
		for _, c := range x.Base.EngineMix {
			p := fmt.Sprintf("%dx%g", c.Count, c.Speed)
			if c.KV != 1 {
				p += fmt.Sprintf(":%g", c.KV)
			}
			parts = append(parts, p)
		}
		engines = "engines " + strings.Join(parts, ",")
	}
	if x.Base.Engine.Timing != engine.TimingBatched {
		engines += " (" + x.Base.Engine.Timing.String() + " timing)"
	}
	return fmt.Sprintf("fleet: %s, %s, %s, spread %s, seed %d", x.Workload.Name(), x.Arrivals, engines, x.Base.Spread, x.Seed)
}

// list splits a comma-separated value, dropping blanks.
func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
