package main

import (
	"flag"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/policy"
)

// loraCostFlags registers the cost's adapter term (policy.LoRACost) for kvgate serve and kvgate
// bench --fleet; prefix starts each help text.
func loraCostFlags(fs *flag.FlagSet, c *policy.LoRACost, prefix string) {
	fs.Float64Var(&c.Load, "lora-load-seconds", c.Load, prefix+"cost: seconds a LoRA adapter costs on a worker where it is not running and a slot is free (its load)")
	fs.Float64Var(&c.SlotWait, "lora-slot-wait-seconds", c.SlotWait, prefix+"cost: seconds a LoRA adapter costs on a worker whose adapter slots are all held by other adapters")
	fs.BoolVar(&c.Blind, "lora-blind", c.Blind, prefix+"cost: ignore adapters (the adapter-blind baseline; requests still go only to workers that list the adapter)")
}

// loraBenchFlags are kvgate bench's adapter traffic and the fleet engines' adapter slots.
type loraBenchFlags struct {
	adapters int
	zipf     float64
}

// registerLoraBenchFlags defines --lora-adapters and --lora-zipf (the workload, live or
// simulated) and --max-loras and --lora-load-time (the fleet's engines).
func registerLoraBenchFlags(fs *flag.FlagSet, f *benchFlags) {
	fs.IntVar(&f.lora.adapters, "lora-adapters", 0, "each session names one of this many LoRA adapters (lora-00, lora-01, …) as its model, with Zipf popularity (0: the base model)")
	fs.Float64Var(&f.lora.zipf, "lora-zipf", 1.1, "Zipf exponent of the adapters' popularity, > 1")
	fs.IntVar(&f.fleet.engine.MaxLoras, "max-loras", 0, "fleet engine: LoRA adapter slots; a request for an adapter in none waits for one and pays --lora-load-time (0: adapters always run)")
	fs.DurationVar(&f.fleet.engine.LoraLoad, "lora-load-time", 0, "fleet engine: time to load an adapter into a slot (0: the engine's default, 50ms)")
}

// withAdapters gives w's sessions the adapters --lora-adapters asks for.
func (f *benchFlags) withAdapters(w bench.Workload, err error) (bench.Workload, error) {
	if err != nil {
		return nil, err
	}
	return bench.WithAdapters(w, f.lora.adapters, f.lora.zipf, f.seed)
}

// addLoraPDFlags defines --pd-protocol, the prefill/decode protocol of disaggregated pools whose
// prefill worker carries no pd_protocol label, and the flags of adapter load-on-demand.
func addLoraPDFlags(fs *flag.FlagSet, g *gateway.Config) {
	fs.BoolVar(&g.LoRA.OnDemand, "lora-load-on-demand", false, "load a LoRA adapter no worker lists, when --lora-sources allows it, on the least-cost worker of the base model with a free adapter slot (POST /v1/load_lora_adapter)")
	fs.Func("lora-sources", "the adapters --lora-load-on-demand may load and where from, comma-separated NAME=SOURCE (the engine's lora_path); no other adapter is ever loaded", func(v string) error {
		m, err := gateway.ParseLoRASources(v)
		g.LoRA.Sources = m
		return err
	})
	fs.IntVar(&g.LoRA.MaxLoads, "lora-max-loads", 2, "adapter loads on demand in flight at once, gateway-wide; past it a request that needs one is answered 503")
	fs.IntVar(&g.LoRA.MaxLoaded, "lora-max-loaded", 0, "adapters --lora-load-on-demand keeps loaded on one worker (the engine's --max-cpu-loras); at the bound one idle past --lora-idle-unload is unloaded (POST /v1/unload_lora_adapter) to make room (0: no bound, nothing unloaded)")
	fs.DurationVar(&g.LoRA.IdleUnload, "lora-idle-unload", 10*time.Minute, "how long an adapter loaded on demand goes without a request through this gateway before --lora-max-loaded may unload it")
	g.PDProtocol = gateway.PDAuto
	fs.Func("pd-protocol", "prefill/decode protocol of disaggregated pools: auto (by the prefill worker's runtime: vllm for vLLM, else sglang), sglang (bootstrap host/port/room) or vllm (kv_transfer_params, two steps); a worker's pd_protocol label overrides it (default auto)", func(v string) error {
		p, err := gateway.ParsePDProtocol(v)
		g.PDProtocol = p
		return err
	})
}
