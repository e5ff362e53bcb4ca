package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig configures a circuit breaker. Zero fields take the defaults of DefaultBreakerConfig.
type BreakerConfig struct {
	// FailureThreshold is the number of consecutive failures that open the circuit. Default 10.
	FailureThreshold int `yaml:"failure_threshold"`
	// SuccessThreshold is the number of consecutive half-open successes that close it. Default 3.
	SuccessThreshold int `yaml:"success_threshold"`
	// OpenTimeout is how long the circuit stays open before admitting probes. Default 60s.
	OpenTimeout time.Duration `yaml:"open_timeout"`
	// HalfOpenProbes is how many requests may be in flight while half-open. Default 1.
	HalfOpenProbes int `yaml:"half_open_probes"`
	// Disabled turns the breaker off: it always allows.
	Disabled bool `yaml:"disabled"`
}

// DefaultBreakerConfig returns the defaults of DESIGN.md §3.
func DefaultBreakerConfig() BreakerConfig {
	return BreakerConfig{FailureThreshold: 10, SuccessThreshold: 3, OpenTimeout: 60 * time.Second, HalfOpenProbes: 1}
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	d := DefaultBreakerConfig()
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = d.FailureThreshold
	}
	if c.SuccessThreshold <= 0 {
		c.SuccessThreshold = d.SuccessThreshold
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = d.OpenTimeout
	}
	if c.HalfOpenProbes <= 0 {
		c.HalfOpenProbes = d.HalfOpenProbes
	}
	return c
}

// CircuitState is a breaker's state.
type CircuitState int32

const (
	// Closed: requests flow; failures are counted.
	Closed CircuitState = iota
	// Open: no requests until the open timeout passes.
	Open
	// HalfOpen: a few probe requests decide between Closed and Open.
	HalfOpen
)

// String returns the state's name.
func (s CircuitState) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}

// Breaker is a per-worker circuit breaker. Only the worker's own failures (transport errors, 5xx,
// timeouts) are to be recorded as failures: never a client cancel or a client-caused 4xx. The zero
// value is not usable; workers initialise theirs in New.
type Breaker struct {
	cfg BreakerConfig

	state    atomic.Int32
	openedAt atomic.Int64 // unix nanos when last opened
	probes   atomic.Int32 // half-open probes in flight

	mu        sync.Mutex
	failures  int
	successes int
	// onChange, when set, is called (outside the lock) on every state transition.
	onChange func(from, to CircuitState)
}

func (b *Breaker) init(cfg BreakerConfig) { b.cfg = cfg.withDefaults() }

// OnChange registers fn to be told of every transition. Call it before the worker is shared.
func (b *Breaker) OnChange(fn func(from, to CircuitState)) { b.onChange = fn }

// State returns the current state, turning Open into HalfOpen once the timeout has passed.
func (b *Breaker) State(now time.Time) CircuitState {
	s := CircuitState(b.state.Load())
	if s == Open && now.UnixNano()-b.openedAt.Load() >= int64(b.cfg.OpenTimeout) {
		return HalfOpen
	}
	return s
}

// Allows reports whether a request may be sent now. It does not reserve a probe slot.
func (b *Breaker) Allows(now time.Time) bool {
	if b.cfg.Disabled {
		return true
	}
	switch b.State(now) {
	case Closed:
		return true
	case HalfOpen:
		return int(b.probes.Load()) < b.cfg.HalfOpenProbes
	default:
		return false
	}
}

// Begin marks the start of a request to the worker and returns a func that records its outcome:
// done(true) success, done(false) a worker failure. A request that ended for a reason that is not
// the worker's (client cancel, client 4xx) must call neither; call the returned abandon instead.
func (b *Breaker) Begin(now time.Time) (done func(ok bool), abandon func()) {
	probe := !b.cfg.Disabled && b.State(now) == HalfOpen
	if probe {
		b.probes.Add(1)
	}
	var once atomic.Bool
	release := func() bool {
		if !once.CompareAndSwap(false, true) {
			return false
		}
		if probe {
			b.probes.Add(-1)
		}
		return true
	}
	done = func(ok bool) {
		if release() {
			b.record(ok, time.Now())
		}
	}
	abandon = func() { release() }
	return done, abandon
}

func (b *Breaker) record(ok bool, now time.Time) {
	if b.cfg.Disabled {
		return
	}
	b.mu.Lock()
	var changes [2][2]CircuitState
	n := 0
	from := b.State(now)
	if stored := CircuitState(b.state.Load()); stored != from {
		// The open timeout passed: this outcome is the first seen half-open.
		b.state.Store(int32(from))
		b.failures, b.successes = 0, 0
		changes[n] = [2]CircuitState{stored, from}
		n++
	}
	to := from
	switch from {
	case Closed:
		if ok {
			b.failures = 0
		} else if b.failures++; b.failures >= b.cfg.FailureThreshold {
			to = Open
		}
	case HalfOpen:
		if !ok {
			to = Open
		} else if b.successes++; b.successes >= b.cfg.SuccessThreshold {
			to = Closed
		}
	case Open:
		// A request admitted before the circuit opened: its outcome changes nothing.
	}
	if to != from {
		b.failures, b.successes = 0, 0
		if to == Open {
			b.openedAt.Store(now.UnixNano())
		}
		b.state.Store(int32(to))
		changes[n] = [2]CircuitState{from, to}
		n++
	}
	fn := b.onChange
	b.mu.Unlock()
	if fn != nil {
		for _, c := range changes[:n] {
			fn(c[0], c[1])
		}
	}
}
