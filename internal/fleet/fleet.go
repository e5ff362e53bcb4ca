// Package fleet is a discrete-event simulator, in virtual time, of G gateway replicas in front of
// W inference engines. Each simulated gateway has its own worker objects (its own in-flight
// counters), its own policy instance built by policy.New (its own prefix tree), and its own load
// monitor, which polls every engine at the configured interval, with a random phase per replica,
// so that every snapshot is exactly as stale as in production; load is computed by
// loadmon.Effective, the function the gateway uses. Engines are engine.Engine, the model that
// `kvgate sim` serves on real ports. Nothing here is a re-implementation of routing: a result
// measured in the simulator is the result of the code that serves traffic.
//
// The simulator is single-threaded and deterministic: the same configuration, workload and seed
// give the same Summary, byte for byte. Requests reach a gateway chosen uniformly at random or by
// a hash of the session key (what a load balancer with session affinity in front of the replicas
// would do), then the gateway's policy picks an engine; the request holds the worker's in-flight
// slot of that gateway from the pick until the engine reports it finished.
package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
)

// Spread says how requests are spread over the gateway replicas. The zero value is
// SpreadUniform.
type Spread uint8

const (
	// SpreadUniform sends each request to a gateway chosen uniformly at random (a plain L4 load
	// balancer or DNS round robin in front of the replicas).
	SpreadUniform Spread = iota
	// SpreadSession sends every request of a session to the same gateway (session affinity).
	SpreadSession
)

// String returns the flag name of s.
func (s Spread) String() string {
	if s == SpreadSession {
		return "session"
	}
	return "uniform"
}

// ParseSpread parses "uniform" (or "") and "session".
func ParseSpread(s string) (Spread, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "uniform":
		return SpreadUniform, nil
	case "session":
		return SpreadSession, nil
	}
	return SpreadUniform, fmt.Errorf("unknown spread %q (want uniform or session)", s)
}

// Config describes one simulated fleet. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Engines is the number of engines (W). Default 8.
	Engines int
	// Gateways is the number of gateway replicas (G). Default 1.
	Gateways int
	// Policy is the routing policy name (any name or alias policy.New accepts, or OraclePolicy).
	// Default cache_aware.
	Policy string
	// PolicyConfig holds the policy knobs. Its Loads, Rand, Now and NoBackground are set by the
	// simulator for each gateway. The zero value means policy.DefaultConfig().
	PolicyConfig policy.Config
	// LoadMode is how a gateway computes load from its counters and the snapshot. Zero is
	// ModeEffective.
	LoadMode loadmon.Mode
	// PollInterval is the load monitor's interval. Default 1 s.
	PollInterval time.Duration
	// StaleAfter is the age past which a report no longer counts. Default 3 × PollInterval.
	StaleAfter time.Duration
	// Spread is how requests are spread over gateways. Zero is SpreadUniform.
	Spread Spread
	// GatewayWeights, when set, is each gateway's relative share of the traffic (for example
	// 80, 20: one replica behind a load balancer that favours it), per request under
	// SpreadUniform and per session under SpreadSession. Its length must be Gateways; each
	// weight positive and finite. Empty means an even split.
	GatewayWeights []float64
	// Engine is every engine's cost model and capacity. Zero fields take engine defaults.
	Engine engine.Config
	// EngineMix, when set, makes the fleet heterogeneous: engine i belongs to a class that
	// scales Engine's speed and KV cache (ParseEngineMix). Its counts must add up to Engines
	// (zero Engines takes their sum).
	EngineMix []EngineClass
	// RoutingPrefixBytes is how much of the routing text policies see, as in the gateway.
	// Default 8192.
	RoutingPrefixBytes int
	// FixedRoutingText keeps the routing text at RoutingPrefixBytes past a shared opening too,
	// as in the gateway (gateway.Config.FixedRoutingText; policy.RoutingText).
	FixedRoutingText bool
	// Seed seeds the gateway choice, the policies' randomness and the poll phases. The workload's
	// own seed is separate.
	Seed uint64
	// Failover changes the fleet during the run (failover.go): a removal names an engine by its
	// index (Arg; "" is engine 0), an addition makes a new engine with the next index and names
	// nothing. Empty means none.
	Failover []bench.Change
	// Timeline, when positive, windows the run by send time (Summary.Timeline) with this width.
	Timeline time.Duration
	// Flow models the gateways' flow control (flow.go); the zero value is off.
	Flow FlowModel
	// KVEvents configures the engines' KV-cache events that precise_prefix reads.
	KVEvents KVEvents
	// Warm warms each engine that Failover adds, as the gateway warms a worker that joins
	// (warm.go); the zero value is off.
	Warm policy.WarmConfig
	// Sync models the replica sync plane between the gateways (sync.go); the zero value is off.
	Sync SyncModel
	// PrefillCounters makes the engines' reports carry their prefill counters, as vLLM's
	// /metrics does (prompt tokens, prefix-cache hits, seconds in prefill): each gateway turns
	// their growth into the engine's prompt prefill rate (loadmon.PrefillCounters). False: the
	// reports carry none, as SGLang's /v1/loads.
	PrefillCounters bool
}

// DefaultConfig returns the defaults: 8 engines, 1 gateway, cache_aware on effective load, 1 s
// polls stale after 3 s, uniform spread, default engines, 8192-byte routing text.
func DefaultConfig() Config {
	return Config{
		Engines:            8,
		Gateways:           1,
		Policy:             "cache_aware",
		PolicyConfig:       policy.DefaultConfig(),
		PollInterval:       time.Second,
		StaleAfter:         3 * time.Second,
		RoutingPrefixBytes: 8192,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Engines == 0 && len(c.EngineMix) > 0 {
		c.Engines = mixCount(c.EngineMix)
	}
	c.Engines = cmp.Or(c.Engines, d.Engines)
	c.Gateways = cmp.Or(c.Gateways, d.Gateways)
	c.Policy = cmp.Or(c.Policy, d.Policy)
	if c.PolicyConfig.CacheAware == (policy.CacheAwareConfig{}) && c.PolicyConfig.PrefixHash == (policy.PrefixHashConfig{}) {
		c.PolicyConfig.CacheAware, c.PolicyConfig.PrefixHash = d.PolicyConfig.CacheAware, d.PolicyConfig.PrefixHash
	}
	if c.PolicyConfig.Cost == (policy.CostConfig{}) {
		c.PolicyConfig.Cost = d.PolicyConfig.Cost
	}
	c.PollInterval = cmp.Or(c.PollInterval, d.PollInterval)
	c.StaleAfter = cmp.Or(c.StaleAfter, 3*c.PollInterval)
	c.RoutingPrefixBytes = cmp.Or(c.RoutingPrefixBytes, d.RoutingPrefixBytes)
	return c
}

// Validate reports the first invalid field of c, after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Engines < 1 || c.Engines > 4096:
		return fmt.Errorf("fleet: engines %d must be in [1, 4096]", c.Engines)
	case c.Gateways < 1 || c.Gateways > 256:
		return fmt.Errorf("fleet: gateways %d must be in [1, 256]", c.Gateways)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("fleet: poll interval %v must be at least 1ms", c.PollInterval)
	case c.StaleAfter < c.PollInterval:
		return fmt.Errorf("fleet: stale-after %v must be at least the poll interval %v", c.StaleAfter, c.PollInterval)
	case c.RoutingPrefixBytes < 1:
		return errors.New("fleet: routing prefix bytes must be positive")
	case len(c.GatewayWeights) > 0 && len(c.GatewayWeights) != c.Gateways:
		return fmt.Errorf("fleet: %d gateway weights for %d gateways", len(c.GatewayWeights), c.Gateways)
	}
	for _, w := range c.GatewayWeights {
		if !(w > 0 && w <= 1e6) {
			return fmt.Errorf("fleet: gateway weight %v must be in (0, 1e6]", w)
		}
	}
	if _, err := canonical(c.Policy); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if err := c.PolicyConfig.Validate(); err != nil {
		return fmt.Errorf("fleet: policy config: %w", err)
	}
	if err := c.Engine.Validate(); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if len(c.EngineMix) > 0 {
		if n := mixCount(c.EngineMix); n != c.Engines {
			return fmt.Errorf("fleet: the engine mix has %d engines, the fleet %d", n, c.Engines)
		}
		for i := range c.Engines {
			if err := c.engineConfig(i).Validate(); err != nil {
				return fmt.Errorf("fleet: engine %d of the mix: %w", i, err)
			}
		}
	}
	if err := c.KVEvents.Validate(); err != nil {
		return err
	}
	if err := c.Warm.Validate(); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if err := c.Sync.Validate(); err != nil {
		return err
	}
	return validateFailover(c)
}

// canonical returns the canonical name of a policy the simulator runs: any name policy.Canonical
// accepts, or OraclePolicy.
func canonical(name string) (string, error) {
	if strings.EqualFold(strings.TrimSpace(name), OraclePolicy) {
		return OraclePolicy, nil
	}
	return policy.Canonical(name)
}

// Label returns a row label for c: the policy, plus the load mode when it is not the gateway's
// default (loadmon.DefaultConfig), plus the gateway split when it is not even.
func (c Config) Label() string {
	c = c.withDefaults()
	name, err := canonical(c.Policy)
	if err != nil {
		name = c.Policy
	}
	if c.PolicyConfig.Sticky.Enabled {
		name += "+sticky"
		if c.PolicyConfig.Sticky.Placement == policy.PlacePolicy {
			name += "(policy)"
		}
	}
	if c.Warm.Enabled() {
		name += "+warm"
	}
	if c.Gateways > 1 {
		name += c.Sync.label()
	}
	if c.LoadMode != loadmon.DefaultConfig().Mode {
		name += "/" + c.LoadMode.String()
	}
	if len(c.GatewayWeights) > 0 {
		name += " split " + FormatSplit(c.GatewayWeights)
	}
	return name
}

// ParseSplit parses a gateway split written as weights separated by "/", for example "80/20";
// "even" (or "") is the even split, nil.
func ParseSplit(s string) ([]float64, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "even") {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, "/") {
		w, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(w > 0 && w <= 1e6) {
			return nil, fmt.Errorf("gateway split %q: each weight must be a number in (0, 1e6]", s)
		}
		out = append(out, w)
	}
	if len(out) > 256 {
		return nil, fmt.Errorf("gateway split %q: more than 256 gateways", s)
	}
	return out, nil
}

// FormatSplit writes weights as ParseSplit reads them; nil is "even".
func FormatSplit(w []float64) string {
	if len(w) == 0 {
		return "even"
	}
	parts := make([]string, len(w))
	for i, x := range w {
		parts[i] = strconv.FormatFloat(x, 'g', -1, 64)
	}
	return strings.Join(parts, "/")
}
