package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/fleet/suite"
	"github.com/kvgate/kvgate/internal/policy"
)

// runBench runs the bench rig.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f benchFlags
	fs := newBenchFlagSet(&f, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) { f.set = append(f.set, fl.Name) })
	writeOnly := f.target == "" && !f.fleet.on && f.traceOut != ""
	switch {
	case f.fleet.suite != "" && !f.fleet.on:
		return errors.New("bench: --suite runs in the fleet simulator; add --fleet")
	case f.target != "" && f.fleet.on:
		return errors.New("bench: choose --target URL (live) or --fleet (simulated), not both")
	case f.target == "" && !f.fleet.on && !writeOnly:
		return errors.New("bench: say what to measure: --target URL (live) or --fleet (simulated), or give --trace-out FILE to write a generated trace")
	}
	if f.fleet.suite != "" {
		if err := f.runSuite(ctx, stdout, stderr); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		return nil
	}
	w, err := f.withAdapters(f.buildWorkload())
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if writeOnly {
		m, ok := w.(*bench.Mooncake)
		if !ok {
			return fmt.Errorf("bench: --trace-out writes a generated trace (--workload mooncake-synth or mooncake-agent), not %s", w.Name())
		}
		_, err := fmt.Fprintf(stdout, "wrote %s: %s\n", f.traceOut, bench.MeasureMooncake(m.Entries(), f.blockTokens))
		return err
	}
	arr := bench.Arrivals{Rate: f.rate, Concurrency: f.concurrency, Speedup: f.speedup}
	switch {
	case !(f.rateScale > 0 && f.rateScale <= 1e6):
		return fmt.Errorf("bench: --rate-scale %v must be in (0, 1e6]", f.rateScale)
	case f.rateScale != 1 && arr.Closed():
		return errors.New("bench: --rate-scale scales an open loop; a closed loop (--concurrency) has no rate")
	case f.rateScale == 1:
	case arr.Rate > 0:
		arr.Rate *= f.rateScale
	case arr.Speedup > 0:
		arr.Speedup *= f.rateScale
	default:
		arr.Speedup = f.rateScale
	}
	lim := bench.Limits{Duration: f.duration, Requests: f.requests, Warmup: f.warmup}
	// Validate once here so that flag mistakes are reported before anything runs.
	if _, err := bench.NewSchedule(w, arr, lim, f.seed); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rep := &bench.Report{Command: "kvgate bench " + strings.Join(args, " ")}
	if f.changes, err = bench.ParseChanges(f.failover); err != nil {
		return fmt.Errorf("bench: --failover: %w", err)
	}
	if f.timeline == 0 && len(f.changes) > 0 {
		f.timeline = 5 * time.Second
	}
	if f.timeline < 0 {
		return errors.New("bench: --timeline must be >= 0")
	}
	f.fleet.timeline, f.fleet.noProgress = f.timeline, f.noProgress
	f.fleet.failover = f.changes
	if f.target != "" {
		err = f.runLive(ctx, w, arr, lim, rep, stderr)
	} else {
		err = f.fleet.run(ctx, w, arr, lim, f.seed, f.out, rep, stderr)
	}
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return f.emit(rep, stdout)
}

// spec returns the workload the flags name.
func (f *benchFlags) spec() bench.Spec {
	s := bench.Spec{
		Name: f.workload, Trace: f.trace, TraceFormat: f.traceFormat, Seed: f.seed,
		Mooncake: bench.MooncakeOptions{BlockTokens: f.blockTokens, TimeScale: f.timeScale, From: f.from, To: f.to, Spread: f.traceSpread},
		Prefixes: f.prefixes, PrefixWords: f.prefixWords, OutputTokens: f.outTokens,
	}
	if s.Generated() {
		s.Gen = f.generator()
	}
	return s
}

// buildWorkload makes the workload the flags name, and writes a generated trace to --trace-out.
func (f *benchFlags) buildWorkload() (bench.Workload, error) {
	spec := f.spec()
	if f.traceOut != "" && spec.Generated() {
		g, _ := spec.Generator()
		es, err := g.Generate()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.Name, err)
		}
		if err := writeMooncake(f.traceOut, es); err != nil {
			return nil, err
		}
		return bench.NewMooncake(es, bench.MooncakeOptions{BlockTokens: f.blockTokens, TimeScale: f.timeScale, From: f.from, To: f.to, Seed: f.seed, Spread: f.traceSpread})
	}
	return spec.Build()
}

// generator returns the trace generator of --workload: its defaults, with the --gen-* flags
// that were given.
func (f *benchFlags) generator() bench.MooncakeGen {
	g := *bench.DefaultGenerator(f.workload, f.seed)
	// The --gen-* flags given, over those defaults: the same flags registered on g take the
	// values parsed into f.gen.
	given, onG := flag.NewFlagSet("given", flag.ContinueOnError), flag.NewFlagSet("gen", flag.ContinueOnError)
	genFlags(given, &f.gen)
	genFlags(onG, &g)
	for _, name := range f.set {
		if fl := given.Lookup(name); fl != nil {
			_ = onG.Set(name, fl.Value.String()) // cannot fail: the value was parsed by a flag of its type
		}
	}
	g.BlockTokens = f.blockTokens
	return g
}

// writeMooncake writes a generated trace to path.
func writeMooncake(path string, es []bench.MooncakeEntry) error {
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--trace-out: %w", err)
	}
	werr := bench.WriteMooncake(fh, es)
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("--trace-out: %w", werr)
	}
	return nil
}

// runLive drives the workload against f.target.
func (f *benchFlags) runLive(ctx context.Context, w bench.Workload, arr bench.Arrivals, lim bench.Limits, rep *bench.Report, stderr io.Writer) error {
	sched, err := bench.NewSchedule(w, arr, lim, f.seed)
	if err != nil {
		return err
	}
	key := f.apiKey
	if key == "" {
		key = os.Getenv("KVGATE_BENCH_API_KEY")
	}
	cfg := bench.LiveConfig{
		Target: f.target, Model: f.model, APIKey: key, API: f.api, Timeout: f.timeout,
		MaxInflight: f.maxInflight, IgnoreEOS: f.ignoreEOS, SessionHeader: f.sessionHeader,
		Timeline: f.timeline, Failover: f.changes, Admin: f.admin, AdminKey: os.Getenv("KVGATE_BENCH_ADMIN_KEY"),
	}
	if !f.noProgress && progressTo(stderr) {
		cfg.Progress = stderr
	}
	label := f.label
	if label == "" {
		label = "live"
	}
	res, err := bench.RunLive(ctx, cfg, sched, label)
	if err != nil {
		return err
	}
	res.Summary.Target = strings.TrimPrefix(strings.TrimPrefix(f.target, "http://"), "https://")
	res.Summary.Workload = w.Name()
	rep.Title = fmt.Sprintf("live: %s against %s, %s", w.Name(), f.target, arr)
	rep.Rows = append(rep.Rows, res.Summary)
	rep.Warnings = append(rep.Warnings, res.Warnings...)
	if f.out != "" && len(res.Summary.TTFTQuantiles) > 0 {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return err
		}
		if err := bench.TTFTCDF("TTFT CDF: "+w.Name(), rep.Rows).SavePNG(filepath.Join(f.out, "ttft-cdf.png")); err != nil {
			return err
		}
		return saveTimelines(f.out, w.Name(), rep.Rows)
	}
	return nil
}

// emit prints the report and writes it under --out.
func (f *benchFlags) emit(rep *bench.Report, stdout io.Writer) error {
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		for name, write := range map[string]func(io.Writer) error{"report.json": rep.WriteJSON, "report.txt": rep.WriteTable} {
			fh, err := os.Create(filepath.Join(f.out, name))
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			werr := write(fh)
			if cerr := fh.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				return fmt.Errorf("bench: writing %s: %w", name, werr)
			}
		}
	}
	if f.asJSON {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteTable(stdout)
}

// experiment builds the grid the flags describe.
func (ff *fleetFlags) experiment(w bench.Workload, arr bench.Arrivals, lim bench.Limits, seed uint64) (*fleet.Experiment, error) {
	pc := policy.DefaultConfig()
	pc.CacheAware.CacheThreshold = ff.cacheThresh
	pc.CacheAware.BalanceAbsThreshold = ff.balanceAbs
	pc.CacheAware.BalanceRelThreshold = ff.balanceRel
	pc.CacheAware.MaxTreeSize = ff.treeSize
	pc.Cost = ff.cost
	pc.Sticky.Enabled, pc.Sticky.Placement = ff.sticky, ff.stickyPlace
	spec := fleet.GridSpec{
		Base: fleet.Config{
			Engines: ff.engines, PolicyConfig: pc, PollInterval: ff.pollInterval, StaleAfter: ff.staleAfter,
			Engine: ff.engine, Failover: ff.failover, Timeline: ff.timeline, KVEvents: ff.kvEvents, Warm: ff.warm,
			Sync: ff.sync, PrefillCounters: ff.prefillCounters, RoutingPrefixBytes: ff.routingPrefix, FixedRoutingText: ff.fixedRoutingText,
		},
		Policies: ff.policies, Gateways: ff.gateways, LoadModes: ff.modes, Splits: ff.splits,
		EngineMix: ff.engineMix, Spread: ff.spread, Timing: ff.timing, Parallel: ff.parallel,
	}
	return spec.Build(w, arr, lim, seed)
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// run runs the fleet grid (or its goodput sweep) and fills rep.
func (ff *fleetFlags) run(ctx context.Context, w bench.Workload, arr bench.Arrivals, lim bench.Limits, seed uint64, out string, rep *bench.Report, stderr io.Writer) error {
	x, err := ff.experiment(w, arr, lim, seed)
	if err != nil {
		return err
	}
	if !ff.noProgress && progressTo(stderr) {
		x.Progress = stderr
	}
	if os.Getenv("GOGC") == "" {
		// The engines' prefix caches are millions of small live objects that every GC cycle
		// scans; a simulation is a short batch job, so trade memory for a quarter less CPU...
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// ...but not without bound: the policies' prefix trees can hold gigabytes, and 400 %
		// headroom on top of that is more than a shared machine has. Past 4 GiB the collector
		// works harder instead.
		debug.SetMemoryLimit(4 << 30)
	}
	rep.Title = x.Title()
	if ff.sweep {
		if arr.Rate <= 0 {
			return errors.New("--sweep needs --rate, the first rate tried")
		}
		hi := ff.sweepHi
		if hi == 0 {
			hi = 64 * arr.Rate
		}
		sc := bench.SweepConfig{SLO: ff.slo, Lo: arr.Rate, Hi: hi, Steps: ff.sweepSteps, MaxErrorRate: 0.001}
		if rep.Sweeps, err = x.Sweep(ctx, sc); err != nil {
			return err
		}
	} else if rep.Rows, err = x.Run(ctx); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if _, err = fleet.Charts(out, w.Name(), rep.Rows, rep.Sweeps); err != nil {
		return err
	}
	return saveTimelines(out, w.Name(), rep.Rows)
}

// saveTimelines writes the hit-rate and TTFT-p99 timelines of rows that have one.
func saveTimelines(dir, title string, rows []bench.Summary) error {
	hit, p99 := bench.TimelineCharts(title, rows)
	if len(hit.Series) == 0 {
		return nil
	}
	if err := hit.SavePNG(filepath.Join(dir, "timeline-hit.png")); err != nil {
		return err
	}
	return p99.SavePNG(filepath.Join(dir, "timeline-p99.png"))
}

// runSuite runs --suite: the fleet flags give the base fleet (engine costs, polls, policy
// knobs), the first of --policies and --load-modes the policy under test and its load signal.
func (f *benchFlags) runSuite(ctx context.Context, stdout, stderr io.Writer) error {
	if f.trace != "" && f.traceFormat != "mooncake" {
		return errors.New("--suite replays its conversation rows from a Mooncake-format trace: add --trace-format mooncake")
	}
	// A one-request placeholder workload lets the fleet flags build and validate the base.
	x, err := f.fleet.experiment(bench.NewSharedPrefix(f.seed), bench.Arrivals{Rate: 1}, bench.Limits{Requests: 1}, f.seed)
	if err != nil {
		return err
	}
	o := suite.Options{
		Policy: x.Policies[0], LoadMode: x.Modes[0], Base: x.Base, Trace: f.trace,
		Window: f.fleet.suiteWindow, Hour: f.fleet.suiteHour, Duration: f.duration, Warmup: f.warmup,
		Workloads: splitList(f.fleet.suiteWorkloads), Shapes: splitList(f.fleet.suiteShapes), Parallel: f.fleet.parallel,
		Slots: f.fleet.suiteSlots,
	}
	for _, t := range splitList(f.fleet.suiteTimings) {
		tm, err := engine.ParseTimingModel(t)
		if err != nil {
			return fmt.Errorf("--suite-timings: %w", err)
		}
		o.Timings = append(o.Timings, tm)
	}
	for _, s := range splitList(f.fleet.suiteSeeds) {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("--suite-seeds: %q is not a seed", s)
		}
		o.Seeds = append(o.Seeds, n)
	}
	if !f.noProgress && progressTo(stderr) {
		o.Progress = stderr
	}
	res, err := suite.Run(ctx, f.fleet.suite, o)
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.WriteTable(stdout)
}

// progressTo reports whether w is a terminal, where progress lines belong; into a file or a
// pipe they would only bury the report.
func progressTo(w io.Writer) bool {
	fh, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := fh.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
