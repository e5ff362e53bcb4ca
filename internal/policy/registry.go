package policy

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/internal/worker"
)

// spec describes one policy: its canonical name, aliases, whether it reads load (so the load
// monitor must run), and its constructor.
type spec struct {
	name      string
	aliases   []string
	loadAware bool
	build     func(Config) (Policy, error)
}

// builtins is the one place where policies are registered by name.
var builtins = []spec{
	{name: "random", build: func(c Config) (Policy, error) { return NewRandom(c), nil }},
	{name: "round_robin", aliases: []string{"roundrobin", "round-robin", "rr"}, build: func(c Config) (Policy, error) { return NewRoundRobin(), nil }},
	{name: "power_of_two", aliases: []string{"poweroftwo", "power-of-two", "p2c"}, loadAware: true, build: func(c Config) (Policy, error) { return NewPowerOfTwo(c), nil }},
	{name: "cache_aware", aliases: []string{"cacheaware", "cache-aware"}, loadAware: true, build: func(c Config) (Policy, error) { return NewCacheAware(c), nil }},
	{name: "consistent_hashing", aliases: []string{"consistenthashing", "consistent-hashing"}, build: func(c Config) (Policy, error) { return NewConsistentHashing(c), nil }},
	{name: "prefix_hash", aliases: []string{"prefixhash", "prefix-hash"}, loadAware: true, build: func(c Config) (Policy, error) { return NewPrefixHash(c), nil }},
	{name: "cache_aware_hash", aliases: []string{"cacheawarehash", "cache-aware-hash"}, loadAware: true, build: func(c Config) (Policy, error) { return NewCacheAwareHash(c), nil }},
	{name: "precise_prefix", aliases: []string{"preciseprefix", "precise-prefix", "precise"}, loadAware: true, build: func(c Config) (Policy, error) { return NewPrecisePrefix(c), nil }},
	{name: "least_load", aliases: []string{"leastload", "least-load"}, loadAware: true, build: func(c Config) (Policy, error) { return NewLeastLoad(c), nil }},
}

func lookup(name string) (*spec, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	for i := range builtins {
		s := &builtins[i]
		if s.name == n {
			return s, nil
		}
		for _, a := range s.aliases {
			if a == n {
				return s, nil
			}
		}
	}
	return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Names returns the canonical policy names, sorted.
func Names() []string {
	out := make([]string, 0, len(builtins))
	for _, s := range builtins {
		out = append(out, s.name)
	}
	sort.Strings(out)
	return out
}

// Canonical resolves an alias to its canonical name.
func Canonical(name string) (string, error) {
	s, err := lookup(name)
	if err != nil {
		return "", err
	}
	return s.name, nil
}

// LoadAware reports whether the named policy reads load.
func LoadAware(name string) bool {
	s, err := lookup(name)
	return err == nil && s.loadAware
}

// New builds the named policy from cfg, wrapped in Sticky when cfg.Sticky.Enabled.
func New(name string, cfg Config) (Policy, error) {
	s, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("policy %s: %w", s.name, err)
	}
	p, err := s.build(cfg.withDefaults())
	if err != nil || !cfg.Sticky.Enabled {
		return p, err
	}
	return NewSticky(p, cfg), nil
}

// PolicyLabel is the worker label that selects a model's policy.
const PolicyLabel = "policy"

// Router owns the policies of every model: the default one, or the one named by the policy label
// of the first worker registered for a model. All of them are built from the same Config.
type Router struct {
	cfg         Config
	defaultName string

	mu      sync.Mutex
	byModel map[string]Policy
}

// NewRouter validates the default policy name and cfg.
func NewRouter(defaultName string, cfg Config) (*Router, error) {
	n, err := Canonical(defaultName)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{cfg: cfg, defaultName: n, byModel: map[string]Policy{}}, nil
}

// Default returns the default policy's canonical name.
func (r *Router) Default() string { return r.defaultName }

// Config returns the configuration policies are built from.
func (r *Router) Config() Config { return r.cfg }

// Validate checks a worker's policy label before the worker is admitted.
func Validate(w *worker.Worker) error {
	if l := w.Label(PolicyLabel); l != "" {
		if _, err := Canonical(l); err != nil {
			return err
		}
	}
	return nil
}

// For returns model's policy, creating it on first use from first's policy label (or the default).
func (r *Router) For(model string, first *worker.Worker) (Policy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.byModel[model]; ok {
		return p, nil
	}
	name := r.defaultName
	if first != nil && first.Label(PolicyLabel) != "" {
		name = first.Label(PolicyLabel)
	}
	p, err := New(name, r.cfg)
	if err != nil {
		return nil, err
	}
	r.byModel[model] = p
	return p, nil
}

// LoadAware reports whether any policy in use, or the default, reads load.
func (r *Router) LoadAware() bool {
	if LoadAware(r.defaultName) || r.cfg.Sticky.Enabled { // sticky sessions judge saturation by load
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.byModel {
		if LoadAware(p.Name()) {
			return true
		}
	}
	return false
}

// Forget tells every policy that holds per-worker state that the worker is gone.
func (r *Router) Forget(workerID string) {
	r.mu.Lock()
	ps := make([]Policy, 0, len(r.byModel))
	for _, p := range r.byModel {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	for _, p := range ps {
		if f, ok := p.(Forgetter); ok {
			f.Forget(workerID)
		}
	}
}

// Policies returns model → policy for every model seen so far.
func (r *Router) Policies() map[string]Policy {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]Policy, len(r.byModel))
	for m, p := range r.byModel {
		out[m] = p
	}
	return out
}

// Close stops the background work of every policy that has some (cache_aware's eviction loop)
// and waits for it to exit. Call it once the router is no longer used.
func (r *Router) Close() error {
	ps := r.Policies()
	var errs []error
	for _, p := range ps {
		if c, ok := p.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}
