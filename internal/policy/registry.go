package policy

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

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
	{name: "cache_aware_hash", aliases: []string{"cacheawarehash", "cache-aware-hash", "cost"}, loadAware: true, build: func(c Config) (Policy, error) { return NewCacheAwareHash(c), nil }},
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

// Evicter is implemented by policies that trim their state on demand (the prefix tree); the
// fleet simulator calls it on its virtual clock instead of running a background loop.
type Evicter interface {
	Evict()
}

// LazyLoads is a load view that does its work only once a policy reads it: the router calls Need
// whenever it builds a load-aware policy, so that polling starts when the first one appears,
// whoever created it (the default, a worker label, a pool). *loadmon.Monitor implements it.
type LazyLoads interface {
	Loads
	Need()
}

// Pooled names one policy the router holds: the policy of one model's pool of one role.
type Pooled struct {
	Model  string
	Role   worker.Type
	Policy Policy
}

// Label is the pool's name in metrics: the model, with "#prefill" or "#decode" for the halves of
// a disaggregated pool.
func (p Pooled) Label() string {
	if p.Role == worker.Regular {
		return p.Model
	}
	return p.Model + "#" + p.Role.String()
}

// routed is a built policy and the canonical name it was built from; p nil means none.
type routed struct {
	name string
	p    Policy
}

// roles holds one model's policies, indexed by worker.Type. Immutable once published.
type roles [3]routed

// table maps a model to its policies. Immutable once published: a change builds a new one.
type table map[string]*roles

// clone returns a copy of t whose per-model arrays may be changed.
func (t table) clone() table {
	out := make(table, len(t)+1)
	for m, rs := range t {
		c := *rs
		out[m] = &c
	}
	return out
}

func (t table) get(model string, role worker.Type) (routed, bool) {
	if rs, ok := t[model]; ok && rs[role].p != nil {
		return rs[role], true
	}
	return routed{}, false
}

func (t table) set(model string, role worker.Type, e routed) {
	rs := t[model]
	if rs == nil {
		rs = &roles{}
		t[model] = rs
	}
	rs[role] = e
}

// Router owns the policy of every (model, role) pool. A pool's policy is the one named by the
// policy label of its first registered worker that has one, else the default; it is rebuilt when
// that changes, and released (its background work stopped) when the pool's last worker leaves.
// All policies are built from the same Config.
//
// The table is an immutable map (model → policy per role) published with an atomic pointer:
// For takes no lock. Changes
// (Sync, and the first For of a pool Sync has not seen) build a new table under mu.
type Router struct {
	cfg         Config
	defaultName string

	mu    sync.Mutex
	table atomic.Pointer[table]
	// onChange, when set, hears every policy a pool gets (OnChange).
	onChange func(Change)
}

// Change is a pool's policy being set or switched by Sync: the pool's first policy (From ""),
// or a new one because the policy label in force changed.
type Change struct {
	Model string
	Role  worker.Type
	// From is the canonical name of the policy replaced; "" for a pool that had none.
	From string
	// To is the canonical name of the new policy.
	To string
	// Worker is the worker whose policy label chose To; nil when To is the default because no
	// worker of the pool has a policy label (any more).
	Worker *worker.Worker
}

// OnChange sets f to hear every Change Sync makes, after the new table is published. Call it
// before Attach; f runs on the goroutine that changed the registry and must not block.
func (r *Router) OnChange(f func(Change)) {
	r.mu.Lock()
	r.onChange = f
	r.mu.Unlock()
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
	if cfg.Budget == nil {
		cfg.Budget = NewTreeBudget(cfg.CacheAware.TreeBudget)
	}
	r := &Router{cfg: cfg, defaultName: n}
	r.table.Store(&table{})
	if LoadAware(n) || cfg.Sticky.Enabled { // sticky sessions judge saturation by load
		r.need()
	}
	return r, nil
}

// Default returns the default policy's canonical name.
func (r *Router) Default() string { return r.defaultName }

// Config returns the configuration policies are built from, its Budget set.
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

// For returns the policy of model's pool of role. A pool that Sync has not seen (a router not
// attached to a registry) gets the default policy, built once.
func (r *Router) For(model string, role worker.Type) (Policy, error) {
	if rs, ok := (*r.table.Load())[model]; ok && rs[role].p != nil {
		return rs[role].p, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.table.Load()
	if e, ok := old.get(model, role); ok {
		return e.p, nil
	}
	e, err := r.build(r.defaultName)
	if err != nil {
		return nil, err
	}
	next := old.clone()
	next.set(model, role, e)
	r.table.Store(&next)
	return e.p, nil
}

// build builds the named policy and, when it reads load, tells the load view it is needed.
func (r *Router) build(name string) (routed, error) {
	n, err := Canonical(name)
	if err != nil {
		return routed{}, err
	}
	p, err := New(n, r.cfg)
	if err != nil {
		return routed{}, err
	}
	if LoadAware(n) || r.cfg.Sticky.Enabled {
		r.need()
	}
	return routed{name: n, p: p}, nil
}

func (r *Router) need() {
	if l, ok := r.cfg.Loads.(LazyLoads); ok {
		l.Need()
	}
}

// Attach keeps the router in line with reg: it syncs now and after every registry event.
func (r *Router) Attach(reg *worker.Registry) {
	reg.Subscribe(func(worker.Event) { r.Sync(reg.View()) })
	r.Sync(reg.View())
}

// Sync brings the table in line with v: a new pool gets its policy, a pool whose policy label
// changed gets a new policy, and a pool with no workers left is released: its policy is closed
// (background work stopped and waited for) and dropped, so its metric series go with it. A label
// naming an unknown policy (admission validates labels, so only a bug) keeps the old policy.
func (r *Router) Sync(v *worker.View) {
	r.mu.Lock()
	old := *r.table.Load()
	next := table{}
	var released []Policy
	var changes []Change
	for _, m := range v.Models {
		pool := v.Pool(m)
		for role, ws := range map[worker.Type][]*worker.Worker{worker.Regular: pool.Regular, worker.Prefill: pool.Prefill, worker.Decode: pool.Decode} {
			if len(ws) == 0 {
				continue
			}
			want := r.defaultName
			var by *worker.Worker
			for _, w := range ws {
				if l := w.Label(PolicyLabel); l != "" {
					want, by = l, w
					break
				}
			}
			if n, err := Canonical(want); err == nil {
				want = n
			}
			prev, had := old.get(m, role)
			if had && prev.name == want {
				next.set(m, role, prev)
				continue
			}
			e, err := r.build(want)
			if err != nil {
				if had {
					next.set(m, role, prev)
				}
				continue
			}
			if had {
				released = append(released, prev.p)
			}
			next.set(m, role, e)
			changes = append(changes, Change{Model: m, Role: role, From: prev.name, To: e.name, Worker: by})
		}
	}
	for m, rs := range old {
		for role, e := range rs {
			if _, kept := next.get(m, worker.Type(role)); e.p != nil && !kept {
				released = append(released, e.p)
			}
		}
	}
	r.table.Store(&next)
	onChange := r.onChange
	r.mu.Unlock()
	if onChange != nil {
		for _, c := range changes {
			onChange(c)
		}
	}
	for _, p := range released {
		if c, ok := p.(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// InForce returns the canonical name of the policy model's pool of role has now; ok is false
// for a pool that has none yet.
func (r *Router) InForce(model string, role worker.Type) (name string, ok bool) {
	e, ok := (*r.table.Load()).get(model, role)
	return e.name, ok
}

// LoadAware reports whether any policy in use, or the default, reads load.
func (r *Router) LoadAware() bool {
	if LoadAware(r.defaultName) || r.cfg.Sticky.Enabled { // sticky sessions judge saturation by load
		return true
	}
	for _, rs := range *r.table.Load() {
		for _, e := range rs {
			if e.p != nil && LoadAware(e.name) {
				return true
			}
		}
	}
	return false
}

// Forget tells every policy that holds per-worker state that the worker is gone.
func (r *Router) Forget(workerID string) {
	for _, rs := range *r.table.Load() {
		for _, e := range rs {
			if f, ok := e.p.(Forgetter); ok {
				f.Forget(workerID)
			}
		}
	}
}

// Policies returns every policy the router holds, sorted by model and role.
func (r *Router) Policies() []Pooled {
	t := *r.table.Load()
	out := make([]Pooled, 0, len(t))
	for m, rs := range t {
		for role, e := range rs {
			if e.p != nil {
				out = append(out, Pooled{Model: m, Role: worker.Type(role), Policy: e.p})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].Role < out[j].Role
	})
	return out
}

// Close stops the background work of every policy that has some (cache_aware's eviction loop)
// and waits for it to exit. Call it once the router is no longer used.
func (r *Router) Close() error {
	r.mu.Lock()
	t := *r.table.Load()
	r.table.Store(&table{})
	r.mu.Unlock()
	var errs []error
	for _, rs := range t {
		for _, e := range rs {
			if c, ok := e.p.(io.Closer); ok {
				errs = append(errs, c.Close())
			}
		}
	}
	return errors.Join(errs...)
}
