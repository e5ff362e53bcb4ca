package sim

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
)

// Flags are the command-line flags of `kvgate sim` (and of any command that starts simulated
// engines): fleet shape, model, flavor, every cost-model knob and the fault knobs. Register them
// with RegisterFlags, parse, then call Config.
type Flags struct {
	// Count is the number of engines (--count, default 1).
	Count int
	// Host is the listen host (--host, default 127.0.0.1).
	Host string
	// BasePort is the first engine's port; engine i listens on BasePort+i (--base-port, default
	// 31000; 0 picks ephemeral ports on 127.0.0.1).
	BasePort int
	// FaultEngines lists the engine indices the fault flags apply to (--fault-engines,
	// comma-separated; empty means every engine).
	FaultEngines string

	cfg            Config
	eventsDial     string
	eventsEncoding string
	decodeBaseMS   float64
	decodePerReqMS float64
	timing         string
	loraModules    string
}

// RegisterFlags defines the simulator's flags on fs and returns where they are stored.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	d := engine.DefaultConfig()
	fs.IntVar(&f.Count, "count", 1, "number of simulated engines, each on its own port")
	fs.StringVar(&f.Host, "host", "127.0.0.1", "host to listen on")
	fs.IntVar(&f.BasePort, "base-port", 31000, "port of the first engine; engine i listens on base-port+i (0: ephemeral)")
	fs.StringVar(&f.cfg.Model, "model", DefaultModel, "model id served")
	fs.StringVar(&f.cfg.Flavor, "flavor", FlavorSGLang, "server to imitate: sglang or vllm (owned_by, /metrics names)")
	fs.IntVar(&f.cfg.MaxTokens, "max-tokens", 128, "output tokens of a request that names none")
	fs.Uint64Var(&f.cfg.Seed, "seed", 0, "seed of the fault dice")
	fs.IntVar(&f.cfg.Engine.BlockSize, "block-size", d.BlockSize, "tokens per KV block (the prefix-cache unit)")
	fs.IntVar(&f.cfg.Engine.KVTokens, "kv-tokens", d.KVTokens, "KV-cache capacity in tokens")
	fs.IntVar(&f.cfg.Engine.MaxRunning, "max-running", d.MaxRunning, "most requests running at once")
	fs.IntVar(&f.cfg.Engine.PrefillChunk, "prefill-chunk", d.PrefillChunk, "most prompt tokens prefilled per step")
	fs.Float64Var(&f.cfg.Engine.PrefillTPS, "prefill-tps", d.PrefillTPS, "prefill speed in tokens per second")
	fs.Float64Var(&f.decodeBaseMS, "decode-base-ms", ms(d.DecodeBase), "fixed cost of a decode step in milliseconds")
	fs.Float64Var(&f.decodePerReqMS, "decode-per-req-ms", ms(d.DecodePerReq), "added decode-step cost per decoding request in milliseconds")
	fs.StringVar(&f.timing, "engine-timing", d.Timing.String(), "engine timing model: batched (continuous batching with chunked prefill) or per-slot (each running request prefills and decodes on its own clock, as llm-d-inference-sim does)")
	fs.DurationVar(&f.cfg.Engine.PrefillOverhead, "prefill-overhead", d.PrefillOverhead, "per-slot timing: fixed prefill cost of every request")
	fs.Float64Var(&f.cfg.Engine.LoadFactor, "load-factor", d.LoadFactor, "per-slot timing: slowdown with every slot busy, in [1, 100] (1 + (factor-1)(running-1)/(max-running-1))")
	fs.Float64Var(&f.cfg.Faults.ErrorRate, "fault-error-rate", 0, "share of inference requests answered with --fault-error-status, in [0,1]")
	fs.IntVar(&f.cfg.Faults.ErrorStatus, "fault-error-status", 503, "status of injected errors")
	fs.BoolVar(&f.cfg.Faults.Hang, "fault-hang", false, "accept every request and never answer")
	fs.IntVar(&f.cfg.Faults.DieAfterTokens, "fault-die-after-tokens", 0, "drop each request's connection after this many tokens (0: never)")
	fs.DurationVar(&f.cfg.Faults.SlowStart, "fault-slow-start", 0, "answer 503 (health included) for this long after start")
	fs.DurationVar(&f.cfg.Faults.FirstTokenDelay, "fault-first-token-delay", 0, "delay added before each request enters the engine")
	fs.StringVar(&f.FaultEngines, "fault-engines", "", "comma-separated engine indices the fault flags apply to (empty: all)")
	fs.IntVar(&f.cfg.Events.Port, "kv-events-port", 0, "publish KV-cache events (vLLM format, ZeroMQ PUB) on this port; engine i binds port+i (0: off)")
	fs.IntVar(&f.cfg.Events.ReplayPort, "kv-events-replay-port", 0, "serve replays of buffered KV-cache event batches on this port; engine i binds port+i (0: off)")
	fs.StringVar(&f.eventsDial, "kv-events-connect", "", "comma-separated SUB endpoints (a gateway's --kv-events-bind, tcp://host:port) every engine publishes KV-cache events to")
	fs.StringVar(&f.eventsEncoding, "kv-events-encoding", "array", "KV-cache event encoding: array (vLLM's legacy msgspec arrays) or map (newer vLLM)")
	registerLoraFlags(fs, f)
	return f
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Config returns the parsed server configuration, its faults removed, the faults, and the engines
// they apply to (sorted, deduplicated).
func (f *Flags) Config() (cfg Config, faults Faults, faulty []int, err error) {
	if f.Count < 1 {
		return Config{}, Faults{}, nil, fmt.Errorf("--count %d must be positive", f.Count)
	}
	if !(f.decodeBaseMS >= 0 && f.decodePerReqMS >= 0) {
		return Config{}, Faults{}, nil, fmt.Errorf("decode costs must not be negative")
	}
	cfg = f.cfg
	for _, d := range strings.Split(f.eventsDial, ",") {
		if d = strings.TrimSpace(d); d != "" {
			cfg.Events.Dial = append(cfg.Events.Dial, d)
		}
	}
	switch f.eventsEncoding {
	case "array", "":
	case "map":
		cfg.Events.Encoding = kvevents.Maps
	default:
		return Config{}, Faults{}, nil, fmt.Errorf("--kv-events-encoding %q: want array or map", f.eventsEncoding)
	}
	if cfg.Engine.Timing, err = engine.ParseTimingModel(f.timing); err != nil {
		return Config{}, Faults{}, nil, fmt.Errorf("--engine-timing: %w", err)
	}
	if cfg.LoraModules, err = ParseLoraModules(f.loraModules); err != nil {
		return Config{}, Faults{}, nil, err
	}
	cfg.Engine.DecodeBase = time.Duration(f.decodeBaseMS * float64(time.Millisecond))
	cfg.Engine.DecodePerReq = time.Duration(f.decodePerReqMS * float64(time.Millisecond))
	if err := cfg.Validate(); err != nil {
		return Config{}, Faults{}, nil, err
	}
	faults, cfg.Faults = cfg.Faults, Faults{}
	seen := make([]bool, f.Count)
	for _, s := range strings.Split(f.FaultEngines, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		i, err := strconv.Atoi(s)
		if err != nil || i < 0 || i >= f.Count {
			return Config{}, Faults{}, nil, fmt.Errorf("--fault-engines: %q is not an engine index in 0..%d", s, f.Count-1)
		}
		seen[i] = true
	}
	all := strings.TrimSpace(strings.ReplaceAll(f.FaultEngines, ",", "")) == ""
	for i, ok := range seen {
		if ok || all {
			faulty = append(faulty, i)
		}
	}
	return cfg, faults, faulty, nil
}
