package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/fleet/suite"
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
	traceSpread time.Duration
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
	// LoRA adapter traffic (lora_flags.go).
	lora loraBenchFlags
}

func newBenchFlagSet(f *benchFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvgate bench (--target URL | --fleet) [flags]

Runs a seeded workload live against any OpenAI-compatible endpoint (--target), or in virtual time
against a simulated fleet of gateways and engines running the real policy and engine code (--fleet).
Progress goes to stderr when it is a terminal, the report to stdout.

`)
		fs.PrintDefaults()
		fmt.Fprint(stderr, "\nThe report's "+bench.ColumnHelp(nil)+bench.PredictionHelp()+bench.SweepHelp())
	}
	fs.StringVar(&f.workload, "workload", "shared-prefix", "workload: "+strings.Join(bench.WorkloadNames, ", "))
	fs.StringVar(&f.trace, "trace", "", "trace file to replay (implies --workload trace)")
	fs.StringVar(&f.traceFormat, "trace-format", "jsonl", "trace file format: jsonl (kvgate's) or mooncake (FAST'25: timestamp, input_length, output_length, hash_ids)")
	fs.IntVar(&f.blockTokens, "block-tokens", 512, "mooncake: tokens per hash id")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "mooncake: multiply the trace's arrival times (0.5 replays twice as fast)")
	fs.DurationVar(&f.from, "from", 0, "mooncake: replay the trace from this offset (trace time)")
	fs.DurationVar(&f.to, "to", 0, "mooncake: replay the trace up to this offset (trace time; 0 = its end)")
	fs.DurationVar(&f.traceSpread, "trace-spread", 0, "mooncake: spread the requests that share a timestamp evenly over this span after it (or up to the next timestamp), undoing a coarse trace clock (the public conversation trace steps by 3s); 0 = at the recorded instants")
	fs.StringVar(&f.traceOut, "trace-out", "", "mooncake-synth, mooncake-agent: also write the generated trace to this file (Mooncake format; replay it with --trace FILE --trace-format mooncake); without --target or --fleet, only write it and print its shape")
	f.gen = *bench.NewMooncakeGen(0)
	genFlags(fs, &f.gen)
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
	fs.StringVar(&f.label, "label", "", "row label of a live run (default: live; the target has a column of its own)")
	fs.StringVar(&f.target, "target", "", "live: base URL of an OpenAI-compatible server; several comma-separated URLs take requests in turn")
	fs.StringVar(&f.model, "model", "", "live: model id (default: the first one in GET /v1/models)")
	fs.StringVar(&f.apiKey, "api-key", "", "live: bearer token (default $KVGATE_BENCH_API_KEY)")
	fs.StringVar(&f.api, "api", "chat", "live: chat or completions")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "live: per-request timeout")
	fs.IntVar(&f.maxInflight, "max-inflight", 2048, "live, open loop: most requests in flight")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "live: send ignore_eos so SGLang/vLLM generate exactly max_tokens")
	fs.BoolVar(&f.sessionHeader, "session-header", true, "live: send each session's key as x-session-id")
	fs.BoolVar(&f.noProgress, "no-progress", false, "no progress on the terminal (none is drawn into a file or pipe anyway)")
	fs.StringVar(&f.failover, "failover", "", "worker changes during the run, comma-separated: remove[:WHICH]@TIME, add[:URL]@TIME (fleet: WHICH is an engine index, add makes a new engine; live: WHICH is an index by URL order or a URL, and add needs the URL; uses --admin)")
	fs.DurationVar(&f.timeline, "timeline", 0, "window the run by send time with this width: hit rate and TTFT over time, in the report and as charts (default 5s with --failover)")
	fs.StringVar(&f.admin, "admin", "", "live failover: the gateway's admin base URL (key from $KVGATE_BENCH_ADMIN_KEY)")
	f.fleet.register(fs)
	registerLoraBenchFlags(fs, f)
	return fs
}

// fleetFlags are the flags of the fleet simulator.
type fleetFlags struct {
	on           bool
	noProgress   bool // set from --no-progress
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
	cost         policy.CostConfig
	engineMix    string
	sticky       bool
	stickyPlace  string
	kvEvents     fleet.KVEvents
	warm         policy.WarmConfig
	sync         fleet.SyncModel
	// prefillCounters: the engines' reports carry vLLM's prefill counters (fleet.Config).
	prefillCounters bool
	// routingPrefix is the bytes of each prompt the gateways' policies see (fleet.Config).
	routingPrefix int
	// fixedRoutingText keeps the routing text at routingPrefix past a shared opening too (fleet.Config).
	fixedRoutingText bool

	suite          string
	suiteWorkloads string
	suiteShapes    string
	suiteTimings   string
	suiteSeeds     string
	suiteWindow    time.Duration
	suiteHour      bool
	suiteSlots     int

	sweep      bool
	slo        time.Duration
	sweepLo    float64
	sweepHi    float64
	sweepSteps int

	// Set from the bench flags: the run's worker changes and timeline window.
	failover []bench.Change
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
	fs.IntVar(&ff.routingPrefix, "routing-prefix-bytes", fleet.DefaultConfig().RoutingPrefixBytes, "fleet: bytes of each prompt the gateways' policies see, as kvgate serve's flag")
	fs.BoolVar(&ff.fixedRoutingText, "routing-prefix-fixed", false, "fleet: the routing text is the first --routing-prefix-bytes of each prompt even where the tree holds all of them for several workers, as kvgate serve's flag")
	fs.BoolVar(&ff.prefillCounters, "engine-prefill-counters", false, "fleet engine: the reports carry vLLM's prefill counters (prompt tokens, prefix-cache hits, seconds in prefill), from which each gateway reads the engine's prompt prefill rate")
	fs.DurationVar(&ff.engine.PrefillOverhead, "prefill-overhead", d.PrefillOverhead, "fleet engine, per-slot timing: fixed prefill cost of every request")
	fs.Float64Var(&ff.engine.LoadFactor, "load-factor", d.LoadFactor, "fleet engine, per-slot timing: slowdown with every slot busy, in [1, 100]")
	fs.Float64Var(&ff.cacheThresh, "cache-threshold", pd.CacheAware.CacheThreshold, "fleet policy: cache_aware match ratio above which affinity wins")
	fs.Int64Var(&ff.balanceAbs, "balance-abs-threshold", pd.CacheAware.BalanceAbsThreshold, "fleet policy: cache_aware absolute imbalance threshold")
	fs.Float64Var(&ff.balanceRel, "balance-rel-threshold", pd.CacheAware.BalanceRelThreshold, "fleet policy: cache_aware relative imbalance threshold")
	fs.IntVar(&ff.treeSize, "max-tree-size", pd.CacheAware.MaxTreeSize, "fleet policy: characters per worker kept in a prefix tree")
	ff.cost = pd.Cost
	costFlags(fs, &ff.cost, "fleet policy: ")
	fs.BoolVar(&ff.sticky, "sticky-sessions", false, "fleet policy: wrap every policy in sticky sessions (keyed by the session)")
	fs.StringVar(&ff.stickyPlace, "sticky-placement", policy.PlaceHash, "fleet policy: where a new sticky session goes: hash or policy")
	fs.DurationVar(&ff.kvEvents.Delay, "events-delay", 5*time.Millisecond, "fleet precise_prefix: delay from an engine's cache change to every gateway's index")
	fs.DurationVar(&ff.kvEvents.TokenizeBase, "tokenize-base", time.Millisecond, "fleet precise_prefix: fixed cost of one tokenization (added to the request's TTFT)")
	fs.Float64Var(&ff.kvEvents.TokenizeTPS, "tokenize-tps", 2e6, "fleet precise_prefix: tokenizer speed in tokens per second")
	// The warm-up flags are kvgate serve's: the fleet warms each engine --failover adds as the
	// gateway warms a worker that joins.
	addWarmFlags(fs, &ff.warm)
	addFleetSyncFlags(fs, &ff.sync)
	fs.StringVar(&ff.suite, "suite", "", "fleet: run a named suite of experiments and print its target table instead of one grid: "+strings.Join(suite.Names, ", ")+
		" (the first of --policies against the oracle and baselines on every workload, shape, timing and seed; --trace FILE adds the conversation-trace rows; --duration and --warmup bound the synthetic rows, default 120s and 30s)")
	fs.StringVar(&ff.suiteWorkloads, "suite-workloads", "", "fleet suite: comma-separated workloads (default all: "+strings.Join(suite.Workloads, ", ")+")")
	fs.StringVar(&ff.suiteShapes, "suite-shapes", "", "fleet suite: comma-separated fleet shapes (default all: "+strings.Join(suite.Shapes, ", ")+")")
	fs.StringVar(&ff.suiteTimings, "suite-timings", "batched,per-slot", "fleet suite: comma-separated engine timing models")
	fs.StringVar(&ff.suiteSeeds, "suite-seeds", "1,2", "fleet suite: comma-separated seeds")
	fs.DurationVar(&ff.suiteWindow, "suite-window", 15*time.Minute, "fleet suite: trace time the trace rows replay from the start")
	fs.BoolVar(&ff.suiteHour, "suite-hour", false, "fleet suite: add rows replaying the whole conversation and agent traces")
	fs.IntVar(&ff.suiteSlots, "suite-slots", 8, "fleet suite: running requests per engine of the per-slot rows (4x8 rows: 8)")
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

// genFlags registers the trace generator's --gen-* flags on fs, each defaulting to g's field and
// parsed into it; generator registers them a second time, on --workload's own defaults.
func genFlags(fs *flag.FlagSet, g *bench.MooncakeGen) {
	fs.DurationVar(&g.Duration, "gen-duration", g.Duration, "mooncake-synth, mooncake-agent: length of the generated trace (mooncake-agent default 1h)")
	fs.Float64Var(&g.Rate, "gen-rate", g.Rate, "generated traces: mean requests per second (mooncake-agent default 3.9)")
	fs.IntVar(&g.SharedBlocks, "gen-shared-blocks", g.SharedBlocks, "generated traces: opening blocks every request shares (mooncake-agent default 0)")
	fs.IntVar(&g.ContextTokens, "gen-context-tokens", g.ContextTokens, "generated traces: mean unique tokens of a conversation's first prompt (mooncake-agent default 8500)")
	fs.Float64Var(&g.TurnsMean, "gen-turns", g.TurnsMean, "generated traces: mean turns per conversation (mooncake-agent default 2.8)")
	fs.DurationVar(&g.Think, "gen-think", g.Think, "generated traces: mean time between turns (mooncake-agent default 20s)")
	fs.Float64Var(&g.Burstiness, "gen-burstiness", g.Burstiness, "generated traces: coefficient of variation of conversation inter-arrival gaps (1 = Poisson; mooncake-agent default 4)")
}
