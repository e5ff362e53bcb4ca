package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/loadmon"
)

// Experiment is a grid of fleet runs over one workload: every policy × gateway count × load
// mode, each a separate deterministic simulation.
type Experiment struct {
	// Base is the fleet configuration; its Policy, Gateways and LoadMode are overridden by the
	// grid.
	Base Config
	// Policies, Gateways and Modes span the grid. Empty means Base's value.
	Policies []string
	Gateways []int
	Modes    []loadmon.Mode
	// Splits are gateway splits (Config.GatewayWeights) to run at every gateway count with as
	// many weights; nil in the list is the even split. Empty means Base's split alone.
	Splits [][]float64
	// Workload, Arrivals, Limits and Seed make each run's schedule (a fresh one per run, so all
	// runs see the same requests at the same times).
	Workload bench.Workload
	Arrivals bench.Arrivals
	Limits   bench.Limits
	Seed     uint64
	// Parallel is how many runs go at once. Zero means GOMAXPROCS. Results do not depend on it.
	Parallel int
	// Progress, when set, gets a line as each run of the grid ends (the CLI sets it only on a
	// terminal). Results do not depend on it.
	Progress io.Writer
}

// Configs returns the grid's fleet configurations in report order: by policy, then mode, then
// gateway count.
func (x *Experiment) Configs() []Config {
	pols, gws, modes := x.Policies, x.Gateways, x.Modes
	if len(pols) == 0 {
		pols = []string{x.Base.Policy}
	}
	if len(gws) == 0 {
		gws = []int{x.Base.Gateways}
	}
	if len(modes) == 0 {
		modes = []loadmon.Mode{x.Base.LoadMode}
	}
	splits := x.Splits
	if len(splits) == 0 {
		splits = [][]float64{x.Base.GatewayWeights}
	}
	var out []Config
	for _, p := range pols {
		for _, m := range modes {
			for _, g := range gws {
				for _, sp := range splits {
					if len(sp) > 0 && len(sp) != g {
						continue // a split is for its own gateway count
					}
					c := x.Base
					c.Policy, c.Gateways, c.LoadMode, c.GatewayWeights = p, g, m, sp
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// Validate checks every configuration of the grid and the schedule parameters.
func (x *Experiment) Validate() error {
	if x.Workload == nil {
		return errors.New("fleet: experiment without a workload")
	}
	if _, err := bench.NewSchedule(x.Workload, x.Arrivals, x.Limits, x.Seed); err != nil {
		return err
	}
	gws := x.Gateways
	if len(gws) == 0 {
		gws = []int{x.Base.withDefaults().Gateways}
	}
	for _, sp := range x.Splits {
		if len(sp) > 0 && !slices.Contains(gws, len(sp)) {
			return fmt.Errorf("fleet: gateway split %s needs a run at %d gateways", FormatSplit(sp), len(sp))
		}
	}
	for _, c := range x.Configs() {
		if err := c.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Run runs the grid and returns one summary per configuration, in Configs order.
func (x *Experiment) Run(ctx context.Context) ([]bench.Summary, error) {
	if err := x.Validate(); err != nil {
		return nil, err
	}
	cfgs := x.Configs()
	out := make([]bench.Summary, len(cfgs))
	err := x.each(ctx, len(cfgs), func(i int) error {
		s, err := x.runOne(ctx, cfgs[i], x.Arrivals)
		out[i] = s
		return err
	}, func(i int) string { return cfgs[i].Label() + fmt.Sprintf(" at %d gateways", cfgs[i].Gateways) })
	if err == nil {
		versusOracle(out)
	}
	return out, err
}

// versusOracle sets each row's HitVsOracle from the oracle row at the same gateway count and
// split, if the grid has one.
func versusOracle(rows []bench.Summary) {
	for i := range rows {
		for _, o := range rows {
			if o.Policy == OraclePolicy && o.Gateways == rows[i].Gateways && o.Split == rows[i].Split && o.HitRate > 0 {
				rows[i].HitVsOracle = round3(rows[i].HitRate / o.HitRate)
				break
			}
		}
	}
}

// round3 rounds a ratio to three decimals, as the reports print it.
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// Sweep searches the goodput of every configuration of the grid under sc, varying the open-loop
// rate.
func (x *Experiment) Sweep(ctx context.Context, sc bench.SweepConfig) ([]bench.SweepResult, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if x.Arrivals.Closed() {
		return nil, errors.New("fleet: a goodput sweep varies the open-loop rate; drop --concurrency")
	}
	if err := x.Validate(); err != nil {
		return nil, err
	}
	cfgs := x.Configs()
	out := make([]bench.SweepResult, len(cfgs))
	err := x.each(ctx, len(cfgs), func(i int) error {
		label := cfgs[i].Label()
		if len(x.Gateways) > 1 {
			label = fmt.Sprintf("%s g=%d", label, cfgs[i].Gateways)
		}
		res, err := bench.Sweep(label, sc, func(rate float64) (bench.Summary, error) {
			a := x.Arrivals
			a.Rate = rate
			return x.runOne(ctx, cfgs[i], a)
		})
		out[i] = res
		return err
	}, func(i int) string {
		return "sweep of " + cfgs[i].Label() + fmt.Sprintf(" at %d gateways", cfgs[i].Gateways)
	})
	if err == nil {
		for i := range out {
			for j, o := range out {
				if p, _ := canonical(cfgs[j].Policy); p == OraclePolicy && cfgs[j].Gateways == cfgs[i].Gateways && slices.Equal(cfgs[j].GatewayWeights, cfgs[i].GatewayWeights) && o.Goodput > 0 {
					out[i].GoodputVsOracle = round3(out[i].Goodput / o.Goodput)
					break
				}
			}
		}
	}
	return out, err
}

// runOne simulates one configuration at arrivals a.
func (x *Experiment) runOne(ctx context.Context, c Config, a bench.Arrivals) (bench.Summary, error) {
	sched, err := bench.NewSchedule(x.Workload, a, x.Limits, x.Seed)
	if err != nil {
		return bench.Summary{}, err
	}
	s, err := Run(ctx, c, sched)
	if err != nil {
		return s, fmt.Errorf("%s at %d gateways: %w", c.Label(), c.Gateways, err)
	}
	s.Workload = x.Workload.Name()
	if len(c.Failover) > 0 && s.Timeline != nil {
		return s, x.compareUndisturbed(ctx, c, a, &s)
	}
	return s, nil
}

// each calls fn(0..n-1) on up to Parallel goroutines, which it owns and waits for; the first
// error cancels the remaining calls. With Progress set, each call that ends is reported under
// name(i).
func (x *Experiment) each(ctx context.Context, n int, fn func(i int) error, name func(i int) string) error {
	par := x.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	par = min(par, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var mu sync.Mutex // serializes progress lines and counts them
	done, start := 0, time.Now()
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := time.Now()
				if errs[i] = fn(i); errs[i] != nil {
					cancel()
				}
				if x.Progress != nil && errs[i] == nil {
					mu.Lock()
					done++
					fmt.Fprintf(x.Progress, "fleet: %d/%d done: %s (%v; %v so far)\n", done, n, name(i),
						time.Since(t).Round(100*time.Millisecond), time.Since(start).Round(time.Second))
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// Charts writes the PNG charts of a grid's results to dir and returns their paths: the TTFT CDF
// of every row; with several gateway counts, hit rate and TTFT p99 against the gateway count;
// with sweeps, TTFT p99 against the offered rate.
func Charts(dir, title string, rows []bench.Summary, sweeps []bench.SweepResult) ([]string, error) {
	var paths []string
	save := func(name string, c bench.Chart) error {
		p := filepath.Join(dir, name)
		if err := c.SavePNG(p); err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	}
	multi := map[int]bool{}
	for _, r := range rows {
		multi[r.Gateways] = true
	}
	cdfRows := rows
	if len(multi) > 1 {
		cdfRows = make([]bench.Summary, len(rows))
		for i, r := range rows {
			r.Label = fmt.Sprintf("%s g=%d", r.Label, r.Gateways)
			cdfRows[i] = r
		}
	}
	if cdf := bench.TTFTCDF("TTFT CDF: "+title, cdfRows); len(cdf.Series) > 0 {
		if err := save("ttft-cdf.png", cdf); err != nil {
			return paths, err
		}
	}
	if len(multi) > 1 {
		label := func(s bench.Summary) string { return s.Label }
		hit := bench.Chart{Title: "Token hit rate vs gateways: " + title, XLabel: "gateway replicas", YLabel: "token-weighted hit rate", Points: true,
			Series: bench.ByGateways(rows, label, func(s bench.Summary) float64 { return s.HitRate })}
		p99 := bench.Chart{Title: "TTFT p99 vs gateways: " + title, XLabel: "gateway replicas", YLabel: "TTFT p99 (ms, log scale)", Points: true, LogY: true,
			// A positive floor for the log axis: a row without successes has p99 0.
			Series: bench.ByGateways(rows, label, func(s bench.Summary) float64 { return max(s.TTFTP99, 0.001) })}
		if err := save("hit-vs-gateways.png", hit); err != nil {
			return paths, err
		}
		if err := save("p99-vs-gateways.png", p99); err != nil {
			return paths, err
		}
	}
	if len(sweeps) > 0 {
		c := bench.Chart{Title: "TTFT p99 vs offered rate: " + title, XLabel: "offered rate (req/s)", YLabel: "TTFT p99 (ms, log scale)", Points: true, LogY: true}
		for _, sw := range sweeps {
			s := bench.Series{Label: sw.Label}
			pts := append([]bench.SweepPoint(nil), sw.Points...)
			sortPoints(pts)
			for _, p := range pts {
				s.X, s.Y = append(s.X, p.Rate), append(s.Y, max(p.TTFTP99, 0.001))
			}
			c.Series = append(c.Series, s)
		}
		if err := save("sweep-p99.png", c); err != nil {
			return paths, err
		}
	}
	return paths, nil
}

// sortPoints orders sweep points by rate (insertion sort: a sweep has a dozen points).
func sortPoints(p []bench.SweepPoint) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j].Rate < p[j-1].Rate; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}
