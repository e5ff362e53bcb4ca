package policy

import (
	"errors"
	"math/rand/v2"
	"time"
)

// Config carries everything any policy may need. Every creation path (the default policy, a
// per-model label, an alias, a prefill/decode policy) builds policies from the same Config, so no
// policy can be created without the load view and the knobs from the flags.
type Config struct {
	// Loads is the load view; nil means LocalLoads.
	Loads Loads `yaml:"-"`
	// Rand returns a uniform int in [0,n); it must be safe for concurrent use. nil means
	// math/rand/v2.IntN. Tests and the fleet simulator inject a seeded one.
	Rand func(n int) int `yaml:"-"`
	// Now is the clock; nil means time.Now.
	Now func() time.Time `yaml:"-"`
	// NoBackground: policies start no goroutines; the caller (the virtual-time fleet simulator)
	// calls Evict itself. False (the zero value) in the gateway.
	NoBackground bool `yaml:"-"`
	// KV is the engines' KV-cache event view that precise_prefix routes on; nil makes it
	// route as cache_aware_hash.
	KV KVView `yaml:"-"`
	// Budget bounds the characters held by the prefix trees of all policies built from this
	// Config; nil bounds only each share (MaxTreeSize). NewRouter sets it from
	// CacheAware.TreeBudget when nil.
	Budget *TreeBudget `yaml:"-"`
	// Peers is the replica sync plane the cost-based policies count the other replicas'
	// decisions from (peers.go); nil: no sync, the others are estimated.
	Peers Peers `yaml:"-"`

	CacheAware CacheAwareConfig `yaml:",inline"`
	Cost       CostConfig       `yaml:",inline"`
	PrefixHash PrefixHashConfig `yaml:",inline"`
	Sticky     StickyConfig     `yaml:",inline"`
}

// CacheAwareConfig holds the cache_aware knobs, with the reference gateway's defaults.
type CacheAwareConfig struct {
	// CacheThreshold is the match ratio above which affinity wins. Default 0.3.
	CacheThreshold float64 `yaml:"cache_threshold"`
	// BalanceAbsThreshold: the pool is imbalanced only if max−min load exceeds it. Default 64.
	BalanceAbsThreshold int64 `yaml:"balance_abs_threshold"`
	// BalanceRelThreshold: ...and only if max > rel × min. Default 1.5.
	BalanceRelThreshold float64 `yaml:"balance_rel_threshold"`
	// OverloadTokenUsageThreshold: imbalanced when the max KV usage exceeds it. Default 1.0 (off).
	OverloadTokenUsageThreshold float64 `yaml:"overload_token_usage_threshold"`
	// BalanceTokenUsageThreshold: imbalanced when max−min KV usage exceeds it. Default 1.0 (off).
	BalanceTokenUsageThreshold float64 `yaml:"balance_token_usage_threshold"`
	// EvictionInterval is how often trees are trimmed to MaxTreeSize. Default 120s.
	EvictionInterval time.Duration `yaml:"eviction_interval"`
	// MaxTreeSize is the characters kept per worker per model tree. Default 2^26.
	MaxTreeSize int `yaml:"max_tree_size"`
	// TreeBudget is the characters kept by all prefix trees of a gateway together (every model,
	// every worker), enforced at each eviction pass by the same LRU. Default 2^29 (512 Mi
	// characters: under about 1 GiB of memory); 0 means no gateway-wide bound.
	TreeBudget int64 `yaml:"tree_budget"`
}

// PrefixHashConfig holds the prefix_hash knobs.
type PrefixHashConfig struct {
	// PrefixChars is how many leading characters of the routing text are hashed. Default 1024.
	PrefixChars int `yaml:"prefix_chars"`
	// LoadFactor: a worker above LoadFactor × mean load passes the key on. Default 1.25.
	LoadFactor float64 `yaml:"prefix_hash_load_factor"`
}

// DefaultConfig returns the defaults (the reference gateway's for cache_aware).
func DefaultConfig() Config {
	return Config{
		CacheAware: CacheAwareConfig{
			CacheThreshold:              0.3,
			BalanceAbsThreshold:         64,
			BalanceRelThreshold:         1.5,
			OverloadTokenUsageThreshold: 1.0,
			BalanceTokenUsageThreshold:  1.0,
			EvictionInterval:            120 * time.Second,
			MaxTreeSize:                 1 << 26,
			TreeBudget:                  1 << 29,
		},
		Cost:       DefaultCostConfig(),
		PrefixHash: PrefixHashConfig{PrefixChars: 1024, LoadFactor: 1.25},
		Sticky:     defaultSticky(),
	}
}

// Validate reports the first invalid knob.
func (c *Config) Validate() error {
	ca := c.CacheAware
	switch {
	case ca.CacheThreshold < 0 || ca.CacheThreshold > 1:
		return errors.New("cache_threshold must be in [0,1]")
	case ca.BalanceAbsThreshold < 0:
		return errors.New("balance_abs_threshold must be >= 0")
	case ca.BalanceRelThreshold < 1:
		return errors.New("balance_rel_threshold must be >= 1")
	case ca.OverloadTokenUsageThreshold < 0 || ca.OverloadTokenUsageThreshold > 1:
		return errors.New("overload_token_usage_threshold must be in [0,1]")
	case ca.BalanceTokenUsageThreshold < 0 || ca.BalanceTokenUsageThreshold > 1:
		return errors.New("balance_token_usage_threshold must be in [0,1]")
	case ca.EvictionInterval <= 0:
		return errors.New("eviction_interval must be > 0")
	case ca.MaxTreeSize <= 0:
		return errors.New("max_tree_size must be > 0")
	case ca.TreeBudget < 0:
		return errors.New("tree_budget must be >= 0")
	case c.PrefixHash.PrefixChars <= 0:
		return errors.New("prefix_chars must be > 0")
	case c.PrefixHash.LoadFactor < 1:
		return errors.New("prefix_hash_load_factor must be >= 1")
	}
	if err := c.Cost.validate(); err != nil {
		return err
	}
	return c.Sticky.validate()
}

// withDefaults fills the injected dependencies.
func (c Config) withDefaults() Config {
	if c.Loads == nil {
		c.Loads = LocalLoads{}
	}
	if c.Rand == nil {
		c.Rand = rand.IntN
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
