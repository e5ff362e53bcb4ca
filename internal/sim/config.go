// Package sim serves the engine model (package engine) over HTTP in real time, as `kvgate sim`
// does: an OpenAI-compatible and SGLang-native inference server whose timings — TTFT, inter-token
// latency, queueing, prefix-cache hits — come from the model, with load reports in vLLM or SGLang
// form and fault injection for reliability drills.
//
// A Server is an http.Handler backed by one engine and one driver goroutine that advances the
// engine to the wall clock and wakes the handlers waiting for its events; StartFleet serves many
// Servers on their own ports.
package sim

import (
	"cmp"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

// Flavors a Server can imitate: they change /v1/models owned_by and the /metrics names.
const (
	FlavorSGLang = "sglang"
	FlavorVLLM   = "vllm"
)

// DefaultModel is the model id served when Config.Model is empty.
const DefaultModel = "kvgate-sim"

// Config configures one simulated server.
type Config struct {
	// Engine is the cost model; zero fields take engine.DefaultConfig's values. EmitTokens is
	// always set by the server (streaming needs every step).
	Engine engine.Config
	// Model is the model id served; "" means DefaultModel.
	Model string
	// Flavor is FlavorSGLang or FlavorVLLM; "" means FlavorSGLang.
	Flavor string
	// MaxTokens is the output length of a request that names none; 0 means 128.
	MaxTokens int
	// Faults are the faults injected from the start; the zero value injects none.
	Faults Faults
	// Seed seeds the fault dice (which requests get an error status); 0 is a valid seed.
	Seed uint64
	// Events configures KV-cache event publishing; the zero value publishes none. Only a
	// fleet (StartFleet) publishes: the topic names each engine's address.
	Events Events
	// LoraModules are the LoRA adapters served from the start (lora.go); more may be loaded
	// at run time. Engine.MaxLoras bounds how many run at once.
	LoraModules []LoraModule
}

// Faults are injected failures for reliability work. The zero value injects none.
type Faults struct {
	// ErrorRate is the share of inference requests answered at once with ErrorStatus, in [0,1].
	ErrorRate float64
	// ErrorStatus is the status of those answers; 0 means 503.
	ErrorStatus int
	// Hang makes the server accept every request (health, metrics and loads included) and never
	// answer, until the client gives up or the server closes.
	Hang bool
	// DieAfterTokens, when positive, makes the server drop the connection of every inference
	// request once it has generated that many tokens (mid-stream when streaming).
	DieAfterTokens int
	// SlowStart makes the server answer 503 on every route but /metrics — as an engine that is
	// still loading its weights — for this long after it starts or after SetFaults sets it.
	SlowStart time.Duration
	// FirstTokenDelay is added before each inference request enters the engine (a slow first
	// token on an otherwise healthy server).
	FirstTokenDelay time.Duration
}

// withDefaults returns c with empty fields set to their defaults.
func (c Config) withDefaults() Config {
	c.Model = cmp.Or(c.Model, DefaultModel)
	c.Flavor = cmp.Or(c.Flavor, FlavorSGLang)
	c.MaxTokens = cmp.Or(c.MaxTokens, 128)
	c.Engine.EmitTokens = true
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Engine.Validate(); err != nil {
		return err
	}
	if c.Flavor != FlavorSGLang && c.Flavor != FlavorVLLM {
		return fmt.Errorf("sim: unknown flavor %q (want sglang or vllm)", c.Flavor)
	}
	if c.MaxTokens < 1 {
		return fmt.Errorf("sim: default max tokens %d must be positive", c.MaxTokens)
	}
	if len(c.LoraModules) > MaxAdapters {
		return fmt.Errorf("sim: %d adapters, at most %d", len(c.LoraModules), MaxAdapters)
	}
	for _, m := range c.LoraModules {
		if err := validAdapter(m); err != nil {
			return fmt.Errorf("sim: adapter %q: %w", m.Name, err)
		}
	}
	if err := c.Events.Validate(); err != nil {
		return err
	}
	return c.Faults.Validate()
}

// Validate reports the first invalid fault knob.
func (f Faults) Validate() error {
	switch {
	case !(f.ErrorRate >= 0 && f.ErrorRate <= 1):
		return fmt.Errorf("sim: fault error rate %v not in [0,1]", f.ErrorRate)
	case f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599):
		return fmt.Errorf("sim: fault error status %d not in 400..599", f.ErrorStatus)
	case f.DieAfterTokens < 0 || f.SlowStart < 0 || f.FirstTokenDelay < 0:
		return fmt.Errorf("sim: fault knobs must not be negative")
	}
	return nil
}
