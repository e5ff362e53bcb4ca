package main

import (
	"context"
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
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
)

// benchFlags are the flags of `kvgate bench`.
type benchFlags struct {
	// Workload and arrivals, shared by both instruments.
	workload    string
	trace       string
	traceFormat string
	blockTokens int
	timeScale   float64
	from, to    time.Duration
	traceOut    string
	gen         bench.MooncakeGen
	set         []string // the flags given on the command line
	seed        uint64
	rate        float64
	concurrency int
	speedup     float64
	rateScale   float64
	duration    time.Duration
	requests    int
	warmup      time.Duration
	prefixes    int
	prefixWords int
	outTokens   int

	// Output.
	out    string
	asJSON bool
	label  string

	// Worker changes during the run, and the timeline that shows them.
	failover string
	timeline time.Duration
	admin    string
	changes  []bench.Change

	// Live driver.
	target        string
	model         string
	apiKey        string
	api           string
	timeout       time.Duration
	maxInflight   int
	ignoreEOS     bool
	sessionHeader bool
	noProgress    bool

	// Fleet simulator.
	fleet fleetFlags
}

func newBenchFlagSet(f *benchFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvgate bench (--target URL | --fleet) [flags]

Runs a seeded workload live against any OpenAI-compatible endpoint (--target), or in virtual time
against a simulated fleet of gateways and engines running the real policy and engine code (--fleet).

`)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.workload, "workload", "shared-prefix", "workload: "+strings.Join(bench.WorkloadNames, ", "))
	fs.StringVar(&f.trace, "trace", "", "trace file to replay (implies --workload trace)")
	fs.StringVar(&f.traceFormat, "trace-format", "jsonl", "trace file format: jsonl (kvgate's) or mooncake (FAST'25: timestamp, input_length, output_length, hash_ids)")
	fs.IntVar(&f.blockTokens, "block-tokens", 512, "mooncake: tokens per hash id")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "mooncake: multiply the trace's arrival times (0.5 replays twice as fast)")
	fs.DurationVar(&f.from, "from", 0, "mooncake: replay the trace from this offset (trace time)")
	fs.DurationVar(&f.to, "to", 0, "mooncake: replay the trace up to this offset (trace time; 0 = its end)")
	fs.StringVar(&f.traceOut, "trace-out", "", "mooncake-synth, mooncake-agent: also write the generated trace to this file (Mooncake format; replay it with --trace FILE --trace-format mooncake); without --target or --fleet, only write it and print its shape")
	gd := bench.NewMooncakeGen(0)
	f.gen = *gd
	fs.DurationVar(&f.gen.Duration, "gen-duration", gd.Duration, "mooncake-synth, mooncake-agent: length of the generated trace (mooncake-agent default 1h)")
	fs.Float64Var(&f.gen.Rate, "gen-rate", gd.Rate, "generated traces: mean requests per second (mooncake-agent default 3.9)")
	fs.IntVar(&f.gen.SharedBlocks, "gen-shared-blocks", gd.SharedBlocks, "generated traces: opening blocks every request shares (mooncake-agent default 0)")
	fs.IntVar(&f.gen.ContextTokens, "gen-context-tokens", gd.ContextTokens, "generated traces: mean unique tokens of a conversation's first prompt (mooncake-agent default 8500)")
	fs.Float64Var(&f.gen.TurnsMean, "gen-turns", gd.TurnsMean, "generated traces: mean turns per conversation (mooncake-agent default 2.8)")
	fs.DurationVar(&f.gen.Think, "gen-think", gd.Think, "generated traces: mean time between turns (mooncake-agent default 20s)")
	fs.Float64Var(&f.gen.Burstiness, "gen-burstiness", gd.Burstiness, "generated traces: coefficient of variation of conversation inter-arrival gaps (1 = Poisson; mooncake-agent default 4)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the workload, arrivals and simulation")
	fs.Float64Var(&f.rate, "rate", 0, "open loop: new sessions per second (Poisson)")
	fs.IntVar(&f.concurrency, "concurrency", 0, "closed loop: sessions in progress")
	fs.Float64Var(&f.speedup, "speedup", 0, "trace replay: divide recorded arrival times by this (0 = 1)")
	fs.Float64Var(&f.rateScale, "rate-scale", 1, "multiply the offered rate, of --rate or of a trace's (generated traces too), by this: 2 offers twice the load")
	fs.DurationVar(&f.duration, "duration", 0, "stop sending new requests after this long (virtual time under --fleet)")
	fs.IntVar(&f.requests, "requests", 0, "stop after sending this many requests")
	fs.DurationVar(&f.warmup, "warmup", 0, "send but do not measure the requests of the run's first part (cold caches)")
	fs.IntVar(&f.prefixes, "prefixes", 0, "shared-prefix: number of system prompts (0 = 16); long-context: tenants (0 = 150)")
	fs.IntVar(&f.prefixWords, "prefix-words", 0, "shared-prefix: words per system prompt (0 = 200); long-context: words per context (0 = 6000)")
	fs.IntVar(&f.outTokens, "output-tokens", 0, "shared-prefix and long-context: output tokens per request (0 = 64)")
	fs.StringVar(&f.out, "out", "", "directory for report.json, report.txt and PNG charts")
	fs.BoolVar(&f.asJSON, "json", false, "print the JSON report instead of the table")
	fs.StringVar(&f.label, "label", "", "row label of a live run (default: the target host)")
	fs.StringVar(&f.target, "target", "", "live: base URL of an OpenAI-compatible server; several comma-separated URLs take requests in turn")
	fs.StringVar(&f.model, "model", "", "live: model id (default: the first one in GET /v1/models)")
	fs.StringVar(&f.apiKey, "api-key", "", "live: bearer token (default $KVGATE_BENCH_API_KEY)")
	fs.StringVar(&f.api, "api", "chat", "live: chat or completions")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "live: per-request timeout")
	fs.IntVar(&f.maxInflight, "max-inflight", 2048, "live, open loop: most requests in flight")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "live: send ignore_eos so SGLang/vLLM generate exactly max_tokens")
	fs.BoolVar(&f.sessionHeader, "session-header", true, "live: send each session's key as x-session-id")
	fs.BoolVar(&f.noProgress, "no-progress", false, "live: no progress bar")
	fs.StringVar(&f.failover, "failover", "", "worker changes during the run, comma-separated: remove[:WHICH]@TIME, add[:URL]@TIME (fleet: WHICH is an engine index, add makes a new engine; live: WHICH is an index by URL order or a URL, and add needs the URL; uses --admin)")
	fs.DurationVar(&f.timeline, "timeline", 0, "window the run by send time with this width: hit rate and TTFT over time, in the report and as charts (default 5s with --failover)")
	fs.StringVar(&f.admin, "admin", "", "live failover: the gateway's admin base URL (key from $KVGATE_BENCH_ADMIN_KEY)")
	f.fleet.register(fs)
	return fs
}

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
	case f.target != "" && f.fleet.on:
		return errors.New("bench: choose --target URL (live) or --fleet (simulated), not both")
	case f.target == "" && !f.fleet.on && !writeOnly:
		return errors.New("bench: say what to measure: --target URL (live) or --fleet (simulated), or give --trace-out FILE to write a generated trace")
	}
	w, err := f.buildWorkload()
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
	f.fleet.timeline = f.timeline
	if f.fleet.failover, err = fleet.FromChanges(f.changes); f.fleet.on && err != nil {
		return fmt.Errorf("bench: --failover: %w", err)
	}
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

// buildWorkload makes the workload the flags name.
func (f *benchFlags) buildWorkload() (bench.Workload, error) {
	if f.prefixes < 0 || f.prefixWords < 0 || f.outTokens < 0 {
		return nil, errors.New("--prefixes, --prefix-words and --output-tokens must be >= 0")
	}
	mopt := bench.MooncakeOptions{BlockTokens: f.blockTokens, TimeScale: f.timeScale, From: f.from, To: f.to, Seed: f.seed}
	if f.trace != "" {
		if f.workload != "shared-prefix" && f.workload != "trace" {
			return nil, fmt.Errorf("--trace replays a trace; it cannot be combined with --workload %s", f.workload)
		}
		switch f.traceFormat {
		case "jsonl", "":
			return bench.LoadTrace(f.trace, f.seed)
		case "mooncake":
			return bench.LoadMooncake(f.trace, mopt)
		}
		return nil, fmt.Errorf("--trace-format %q: want jsonl or mooncake", f.traceFormat)
	}
	if f.workload == "mooncake-synth" || f.workload == "mooncake-agent" {
		g := f.generator()
		es, err := g.Generate()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.workload, err)
		}
		if f.traceOut != "" {
			if err := writeMooncake(f.traceOut, es); err != nil {
				return nil, err
			}
		}
		return bench.NewMooncake(es, mopt)
	}
	w, err := bench.NewWorkload(f.workload, f.seed)
	if err != nil {
		return nil, err
	}
	switch w := w.(type) {
	case *bench.SharedPrefix:
		if f.prefixes > 0 {
			w.Prefixes = f.prefixes
		}
		if f.prefixWords > 0 {
			w.PrefixWords = f.prefixWords
		}
		if f.outTokens > 0 {
			w.OutputTokens = f.outTokens
		}
		w.Init()
	case *bench.LongContext:
		if f.prefixes > 0 {
			w.Tenants = f.prefixes
		}
		if f.prefixWords > 0 {
			w.ContextWords = f.prefixWords
		}
		if f.outTokens > 0 {
			w.OutputTokens = f.outTokens
		}
		w.Init()
	}
	return w, nil
}

// generator returns the trace generator of --workload: its defaults, with the --gen-* flags
// that were given.
func (f *benchFlags) generator() bench.MooncakeGen {
	g := *bench.NewMooncakeGen(f.seed)
	if f.workload == "mooncake-agent" {
		g = *bench.NewMooncakeAgentGen(f.seed)
	}
	for _, name := range f.set {
		switch name {
		case "gen-duration":
			g.Duration = f.gen.Duration
		case "gen-rate":
			g.Rate = f.gen.Rate
		case "gen-shared-blocks":
			g.SharedBlocks = f.gen.SharedBlocks
		case "gen-context-tokens":
			g.ContextTokens = f.gen.ContextTokens
		case "gen-turns":
			g.TurnsMean = f.gen.TurnsMean
		case "gen-think":
			g.Think = f.gen.Think
		case "gen-burstiness":
			g.Burstiness = f.gen.Burstiness
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
	if !f.noProgress {
		cfg.Progress = stderr
	}
	label := f.label
	if label == "" {
		label = strings.TrimPrefix(strings.TrimPrefix(f.target, "http://"), "https://")
	}
	res, err := bench.RunLive(ctx, cfg, sched, label)
	if err != nil {
		return err
	}
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

// fleetFlags are the flags of the fleet simulator.
type fleetFlags struct {
	on           bool
	engines      int
	gateways     string
	policies     string
	modes        string
	spread       string
	splits       string
	pollInterval time.Duration
	staleAfter   time.Duration
	parallel     int
	engine       engine.Config
	timing       string
	cacheThresh  float64
	balanceAbs   int64
	balanceRel   float64
	treeSize     int
	engineMix    string
	sticky       bool
	stickyPlace  string
	kvEvents     fleet.KVEvents
	warm         policy.WarmConfig

	sweep      bool
	slo        time.Duration
	sweepLo    float64
	sweepHi    float64
	sweepSteps int

	// Set from the bench flags: the run's worker changes and timeline window.
	failover []fleet.WorkerChange
	timeline time.Duration
}

func (ff *fleetFlags) register(fs *flag.FlagSet) {
	d := engine.DefaultConfig()
	pd := policy.DefaultConfig()
	fs.BoolVar(&ff.on, "fleet", false, "simulate a fleet in virtual time instead of driving a live target")
	fs.IntVar(&ff.engines, "engines", 8, "fleet: number of engines")
	fs.StringVar(&ff.engineMix, "engine-mix", "", `fleet: heterogeneous engines as COUNTxSPEED[:KV] classes, e.g. "6x1,2x0.5" (a quarter half as fast); sets --engines`)
	fs.StringVar(&ff.gateways, "gateways", "1", "fleet: comma-separated gateway replica counts, one run each (e.g. 1,2,4,8)")
	defPolicy, defMode := gatewayDefaults()
	fs.StringVar(&ff.policies, "policies", defPolicy, "fleet: comma-separated policies, one run each, or all ("+strings.Join(policy.Names(), ", ")+"); oracle is the simulator's exact-knowledge bound (default: kvgate serve's default policy)")
	fs.StringVar(&ff.modes, "load-modes", defMode, "fleet: comma-separated load modes, one run each: scaled, effective, local, snapshot, max (default: kvgate serve's default)")
	fs.StringVar(&ff.spread, "spread", "uniform", "fleet: how requests reach gateways: uniform or session")
	fs.StringVar(&ff.splits, "gateway-splits", "", `fleet: comma-separated traffic splits over the gateways, each run at the gateway count with as many weights, e.g. "even,80/20" with --gateways 2 (empty: even)`)
	fs.DurationVar(&ff.pollInterval, "poll-interval", time.Second, "fleet: load monitor interval")
	fs.DurationVar(&ff.staleAfter, "stale-after", 0, "fleet: report staleness bound (0 = 3 intervals)")
	fs.IntVar(&ff.parallel, "parallel", 0, "fleet: simulations run at once (0 = GOMAXPROCS; results do not depend on it)")
	fs.IntVar(&ff.engine.KVTokens, "kv-tokens", d.KVTokens, "fleet engine: KV-cache capacity in tokens")
	fs.IntVar(&ff.engine.MaxRunning, "max-running", d.MaxRunning, "fleet engine: most running requests")
	fs.IntVar(&ff.engine.PrefillChunk, "prefill-chunk", d.PrefillChunk, "fleet engine: prefill tokens per step")
	fs.Float64Var(&ff.engine.PrefillTPS, "prefill-tps", d.PrefillTPS, "fleet engine: prefill tokens per second")
	fs.DurationVar(&ff.engine.DecodeBase, "decode-base", d.DecodeBase, "fleet engine: fixed cost of a decode step")
	fs.DurationVar(&ff.engine.DecodePerReq, "decode-per-req", d.DecodePerReq, "fleet engine: added step cost per decoding request")
	fs.StringVar(&ff.timing, "engine-timing", d.Timing.String(), "fleet engine: timing model, batched (continuous batching, chunked prefill shared by the batch) or per-slot (each running request prefills at --prefill-tps and decodes every --decode-base on its own, as llm-d-inference-sim does)")
	fs.DurationVar(&ff.engine.PrefillOverhead, "prefill-overhead", d.PrefillOverhead, "fleet engine, per-slot timing: fixed prefill cost of every request")
	fs.Float64Var(&ff.engine.LoadFactor, "load-factor", d.LoadFactor, "fleet engine, per-slot timing: slowdown with every slot busy, in [1, 100]")
	fs.Float64Var(&ff.cacheThresh, "cache-threshold", pd.CacheAware.CacheThreshold, "fleet policy: cache_aware match ratio above which affinity wins")
	fs.Int64Var(&ff.balanceAbs, "balance-abs-threshold", pd.CacheAware.BalanceAbsThreshold, "fleet policy: cache_aware absolute imbalance threshold")
	fs.Float64Var(&ff.balanceRel, "balance-rel-threshold", pd.CacheAware.BalanceRelThreshold, "fleet policy: cache_aware relative imbalance threshold")
	fs.IntVar(&ff.treeSize, "max-tree-size", pd.CacheAware.MaxTreeSize, "fleet policy: characters per worker kept in a prefix tree")
	fs.BoolVar(&ff.sticky, "sticky-sessions", false, "fleet policy: wrap every policy in sticky sessions (keyed by the session)")
	fs.StringVar(&ff.stickyPlace, "sticky-placement", policy.PlaceHash, "fleet policy: where a new sticky session goes: hash or policy")
	fs.DurationVar(&ff.kvEvents.Delay, "events-delay", 5*time.Millisecond, "fleet precise_prefix: delay from an engine's cache change to every gateway's index")
	fs.DurationVar(&ff.kvEvents.TokenizeBase, "tokenize-base", time.Millisecond, "fleet precise_prefix: fixed cost of one tokenization (added to the request's TTFT)")
	fs.Float64Var(&ff.kvEvents.TokenizeTPS, "tokenize-tps", 2e6, "fleet precise_prefix: tokenizer speed in tokens per second")
	fs.IntVar(&ff.warm.Prefixes, "warm-prefixes", 0, "fleet: warm each engine --failover adds with up to this many hot prefixes, as kvgate serve --warm-prefixes does (0 = off)")
	fs.IntVar(&ff.warm.MaxTokens, "warm-max-tokens", 0, "fleet: prompt tokens one warm-up may send (0 = the serve default)")
	fs.IntVar(&ff.warm.Concurrency, "warm-concurrency", 0, "fleet: warm requests in flight at once (0 = the serve default)")
	fs.BoolVar(&ff.sweep, "sweep", false, "fleet: search each configuration's goodput (highest rate meeting --slo); --rate is the first rate tried")
	fs.DurationVar(&ff.slo, "slo", 2*time.Second, "fleet sweep: TTFT p99 objective")
	fs.Float64Var(&ff.sweepHi, "sweep-max", 0, "fleet sweep: highest rate tried (0 = 64 × --rate)")
	fs.IntVar(&ff.sweepSteps, "sweep-steps", 6, "fleet sweep: bisection steps")
}

// gatewayDefaults returns kvgate serve's default policy and load mode, read from its flags so
// that a fleet run with no --policies measures what a gateway started with no flags does.
func gatewayDefaults() (policyName, loadMode string) {
	var o serveOptions
	fs := newServeFlags(&o, io.Discard)
	return fs.Lookup("policy").DefValue, fs.Lookup("load-mode").DefValue
}

// experiment builds the grid the flags describe.
func (ff *fleetFlags) experiment(w bench.Workload, arr bench.Arrivals, lim bench.Limits, seed uint64) (*fleet.Experiment, error) {
	x := &fleet.Experiment{Workload: w, Arrivals: arr, Limits: lim, Seed: seed, Parallel: ff.parallel}
	spread, err := fleet.ParseSpread(ff.spread)
	if err != nil {
		return nil, err
	}
	if ff.engine.Timing, err = engine.ParseTimingModel(ff.timing); err != nil {
		return nil, fmt.Errorf("--engine-timing: %w", err)
	}
	defPolicy, _ := gatewayDefaults()
	pc := policy.DefaultConfig()
	pc.CacheAware.CacheThreshold = ff.cacheThresh
	pc.CacheAware.BalanceAbsThreshold = ff.balanceAbs
	pc.CacheAware.BalanceRelThreshold = ff.balanceRel
	pc.CacheAware.MaxTreeSize = ff.treeSize
	pc.Sticky.Enabled, pc.Sticky.Placement = ff.sticky, ff.stickyPlace
	x.Base = fleet.Config{
		Engines: ff.engines, Gateways: 1, Policy: defPolicy, PolicyConfig: pc, Spread: spread,
		PollInterval: ff.pollInterval, StaleAfter: ff.staleAfter, Engine: ff.engine, Seed: seed,
		Failover: ff.failover, Timeline: ff.timeline,
		KVEvents: ff.kvEvents, Warm: ff.warm,
	}
	if ff.engineMix != "" {
		mix, err := fleet.ParseEngineMix(ff.engineMix)
		if err != nil {
			return nil, fmt.Errorf("--engine-mix: %w", err)
		}
		x.Base.EngineMix, x.Base.Engines = mix, 0
	}
	if ff.engines < 1 {
		return nil, fmt.Errorf("--engines %d must be at least 1", ff.engines)
	}
	if ff.parallel < 0 {
		return nil, fmt.Errorf("--parallel %d must be >= 0", ff.parallel)
	}
	for _, p := range splitList(ff.policies) {
		if p == "all" {
			x.Policies = append(x.Policies, policy.Names()...)
			continue
		}
		if _, err := policy.Canonical(p); err != nil && !strings.EqualFold(p, fleet.OraclePolicy) {
			return nil, fmt.Errorf("--policies: %w", err)
		}
		x.Policies = append(x.Policies, p)
	}
	for _, g := range splitList(ff.gateways) {
		n, err := strconv.Atoi(g)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--gateways: %q is not a positive count", g)
		}
		x.Gateways = append(x.Gateways, n)
	}
	for _, m := range splitList(ff.modes) {
		mode, err := loadmon.ParseMode(m)
		if err != nil {
			return nil, fmt.Errorf("--load-modes: %w", err)
		}
		x.Modes = append(x.Modes, mode)
	}
	for _, s := range splitList(ff.splits) {
		sp, err := fleet.ParseSplit(s)
		if err != nil {
			return nil, fmt.Errorf("--gateway-splits: %w", err)
		}
		x.Splits = append(x.Splits, sp)
	}
	if len(x.Policies) == 0 || len(x.Gateways) == 0 || len(x.Modes) == 0 {
		return nil, errors.New("--policies, --gateways and --load-modes must each name at least one value")
	}
	return x, x.Validate()
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
	engines := fmt.Sprintf("%d engines", ff.engines)
	if ff.engineMix != "" {
		engines = "engines " + ff.engineMix
	}
	if x.Base.Engine.Timing != engine.TimingBatched {
		engines += " (" + x.Base.Engine.Timing.String() + " timing)"
	}
	rep.Title = fmt.Sprintf("fleet: %s, %s, %s, spread %s, seed %d", w.Name(), arr, engines, ff.spread, seed)
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
