package worker

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
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
	// FailureRateThreshold, when positive, also opens the circuit once at least this share (in
	// (0,1]) of the last FailureRateWindow outcomes were failures, consecutive or not. Zero turns
	// this trigger off: only FailureThreshold consecutive failures open it. DefaultBreakerConfig
	// sets 0.5: the trigger sheds a worker that fails part of its requests, which consecutive
	// counting barely does (at a 50 % error rate, 10 failures in a row take about 2,000
	// requests on average; the error-storm drill never shed such a worker without it).
	FailureRateThreshold float64 `yaml:"failure_rate_threshold"`
	// FailureRateWindow is the number of recent outcomes FailureRateThreshold looks at; the
	// trigger waits for a full window. Default 20.
	FailureRateWindow int `yaml:"failure_rate_window"`
	// Disabled turns the breaker off: it always allows.
	Disabled bool `yaml:"disabled"`
	// Clock returns the current time; nil means time.Now. Tests inject a fake clock here.
	Clock func() time.Time `yaml:"-"`
}

// DefaultBreakerConfig returns the defaults of the reference gateway: 10 consecutive failures,
// or a failure rate of 0.5 over the last 20 outcomes, open it; half-open after 60 s, 3 successes
// close it.
func DefaultBreakerConfig() BreakerConfig {
	return BreakerConfig{FailureThreshold: 10, SuccessThreshold: 3, OpenTimeout: 60 * time.Second, HalfOpenProbes: 1,
		FailureRateThreshold: 0.5, FailureRateWindow: 20}
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	d := DefaultBreakerConfig()
	c.FailureThreshold = cmp.Or(max(c.FailureThreshold, 0), d.FailureThreshold)
	c.SuccessThreshold = cmp.Or(max(c.SuccessThreshold, 0), d.SuccessThreshold)
	c.OpenTimeout = cmp.Or(max(c.OpenTimeout, 0), d.OpenTimeout)
	c.HalfOpenProbes = cmp.Or(max(c.HalfOpenProbes, 0), d.HalfOpenProbes)
	c.FailureRateWindow = cmp.Or(max(c.FailureRateWindow, 0), d.FailureRateWindow)
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Worker labels that override the gateway-wide breaker settings for one worker. Their names are
// the flag names with underscores.
const (
	LabelCBFailureThreshold = "cb_failure_threshold"
	LabelCBSuccessThreshold = "cb_success_threshold"
	LabelCBTimeout          = "cb_timeout"
	LabelCBHalfOpenProbes   = "cb_half_open_probes"
	LabelCBDisabled         = "disable_circuit_breaker"
	LabelCBFailureRate      = "cb_failure_rate_threshold"
	LabelCBFailureWindow    = "cb_failure_rate_window"
)

// WithLabels returns c overridden by the worker labels cb_failure_threshold, cb_success_threshold,
// cb_timeout (a Go duration), cb_half_open_probes, cb_failure_rate_threshold,
// cb_failure_rate_window and disable_circuit_breaker; absent labels keep c's value. It fails on a
// label whose value does not parse or is out of range.
func (c BreakerConfig) WithLabels(labels map[string]string) (BreakerConfig, error) {
	for _, o := range []struct {
		key string
		dst *int
	}{
		{LabelCBFailureThreshold, &c.FailureThreshold},
		{LabelCBSuccessThreshold, &c.SuccessThreshold},
		{LabelCBHalfOpenProbes, &c.HalfOpenProbes},
		{LabelCBFailureWindow, &c.FailureRateWindow},
	} {
		if err := boundedIntLabel(labels, o.key, o.dst); err != nil {
			return c, err
		}
	}
	if err := boundedDurationLabel(labels, LabelCBTimeout, &c.OpenTimeout, time.Second, 24*time.Hour); err != nil {
		return c, err
	}
	if err := boolLabel(labels, LabelCBDisabled, &c.Disabled); err != nil {
		return c, err
	}
	if v, ok := labels[LabelCBFailureRate]; ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return c, fmt.Errorf("label %s=%q: want a number in [0,1]", LabelCBFailureRate, v)
		}
		c.FailureRateThreshold = f
	}
	return c, c.Validate()
}

// Validate reports the first invalid field; zero values are valid (they mean the default).
func (c BreakerConfig) Validate() error {
	if !(c.FailureRateThreshold >= 0 && c.FailureRateThreshold <= 1) {
		return fmt.Errorf("circuit breaker failure rate threshold %v not in [0,1]", c.FailureRateThreshold)
	}
	if c.FailureThreshold < 0 || c.SuccessThreshold < 0 || c.HalfOpenProbes < 0 || c.FailureRateWindow < 0 || c.OpenTimeout < 0 {
		return fmt.Errorf("circuit breaker settings must not be negative")
	}
	return nil
}

// maxIntLabel bounds every integer label: thresholds, probe counts and windows above it are
// nonsense, and an outcome window that large would cost memory per worker.
const maxIntLabel = 10000

// boundedIntLabel sets dst from a label holding an integer in [1, maxIntLabel].
func boundedIntLabel(labels map[string]string, key string, dst *int) error {
	v, ok := labels[key]
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 || n > maxIntLabel {
		return fmt.Errorf("label %s=%q: want an integer from 1 to %d", key, v, maxIntLabel)
	}
	*dst = n
	return nil
}

// boundedDurationLabel sets dst from a label holding a duration in [lo, hi]. Labels come from
// whoever may register workers, so each has a floor: a health check every nanosecond would burn a
// core.
func boundedDurationLabel(labels map[string]string, key string, dst *time.Duration, lo, hi time.Duration) error {
	v, ok := labels[key]
	if !ok {
		return nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < lo || d > hi {
		return fmt.Errorf("label %s=%q: want a duration from %v to %v", key, v, lo, hi)
	}
	*dst = d
	return nil
}

func boolLabel(labels map[string]string, key string, dst *bool) error {
	v, ok := labels[key]
	if !ok {
		return nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("label %s=%q: want true or false", key, v)
	}
	*dst = b
	return nil
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
// value is not usable; use NewBreaker, or the one New gives each worker.
//
// The Closed path is lock-free. Only the outcomes of requests admitted in the current state count
// (a generation number tells them apart), so a slow request admitted before the circuit opened
// cannot close it again, and a straggler from an earlier closed period cannot reopen it.
type Breaker struct {
	cfg BreakerConfig

	state    atomic.Int32
	gen      atomic.Uint64 // bumped on every transition
	openedAt atomic.Int64  // unix nanos when last opened
	probes   atomic.Int32  // half-open probes in flight

	mu        sync.Mutex
	failures  int // consecutive, while closed
	successes int // consecutive, while half-open
	recent    outcomes
	// onChange, when set, is called (outside the lock) on every state transition.
	onChange func(from, to CircuitState)
}

// NewBreaker returns a closed breaker configured by cfg (zero fields take the defaults).
func NewBreaker(cfg BreakerConfig) *Breaker {
	b := &Breaker{}
	b.init(cfg)
	return b
}

func (b *Breaker) init(cfg BreakerConfig) { b.cfg = cfg.withDefaults() }

// Config returns the breaker's settings with defaults applied.
func (b *Breaker) Config() BreakerConfig { return b.cfg }

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

// Closed reports whether requests flow freely: the breaker is disabled or its circuit closed.
// It reads no clock, so the per-candidate availability check on the routing path stays cheap.
func (b *Breaker) Closed() bool {
	return b.cfg.Disabled || CircuitState(b.state.Load()) == Closed
}

// Allows reports whether a request may be sent now. It does not reserve a probe slot: Begin does.
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

// transition is one state change to report after the lock is released.
type transition struct{ from, to CircuitState }

// Begin admits a request to the worker and returns a func that records its outcome: done(true)
// success, done(false) a worker failure. A request that ended for a reason that is not the
// worker's (client cancel, client 4xx) must call neither; call the returned abandon instead.
// Exactly one of them must be called; later calls do nothing. The request path uses
// Worker.Begin, whose lease settles the breaker along with everything else; Begin serves
// callers that hold no worker.
//
// admitted is false when the circuit is open, or half-open with every probe slot taken; then done
// and abandon are no-ops and the request must go elsewhere.
func (b *Breaker) Begin(now time.Time) (done func(ok bool), abandon func(), admitted bool) {
	t, admitted := b.admit(now)
	if !admitted {
		return func(bool) {}, func() {}, false
	}
	var once atomic.Bool
	done = func(ok bool) {
		if once.CompareAndSwap(false, true) {
			b.settle(t, ok, true)
		}
	}
	abandon = func() {
		if once.CompareAndSwap(false, true) {
			b.settle(t, false, false)
		}
	}
	return done, abandon, true
}

// ticket is one admitted request's claim on the breaker: the generation it was admitted in and
// whether it holds a half-open probe slot.
type ticket struct {
	gen   uint64
	probe bool
}

// admit admits a request, reserving a probe slot when half-open. It allocates nothing.
func (b *Breaker) admit(now time.Time) (t ticket, admitted bool) {
	t.gen = b.gen.Load()
	if b.cfg.Disabled || CircuitState(b.state.Load()) == Closed {
		return t, true
	}
	var ts []transition
	b.mu.Lock()
	ts = b.advanceLocked(now, ts)
	switch CircuitState(b.state.Load()) {
	case Open:
		admitted = false
	case HalfOpen:
		if admitted = int(b.probes.Load()) < b.cfg.HalfOpenProbes; admitted {
			b.probes.Add(1)
			t.probe = true
		}
	default:
		admitted = true
	}
	t.gen = b.gen.Load()
	fn := b.onChange
	b.mu.Unlock()
	notify(fn, ts)
	return t, admitted
}

// settle releases t's probe slot and, when judged, records ok as its outcome. Call it once per
// admitted ticket.
func (b *Breaker) settle(t ticket, ok, judged bool) {
	if t.probe {
		b.probes.Add(-1)
	}
	if judged {
		b.record(ok, t.gen, b.cfg.Clock())
	}
}

// advanceLocked turns Open into HalfOpen once the open timeout has passed.
func (b *Breaker) advanceLocked(now time.Time, ts []transition) []transition {
	if CircuitState(b.state.Load()) == Open && b.State(now) == HalfOpen {
		ts = b.setLocked(Open, HalfOpen, now, ts)
	}
	return ts
}

// setLocked moves the breaker from one state to another, starting a new generation.
func (b *Breaker) setLocked(from, to CircuitState, now time.Time, ts []transition) []transition {
	b.failures, b.successes = 0, 0
	b.recent.reset()
	if to == Open {
		b.openedAt.Store(now.UnixNano())
	}
	b.gen.Add(1)
	b.state.Store(int32(to))
	return append(ts, transition{from, to})
}

func notify(fn func(from, to CircuitState), ts []transition) {
	if fn == nil {
		return
	}
	for _, t := range ts {
		fn(t.from, t.to)
	}
}

// record counts the outcome of a request admitted in generation gen.
func (b *Breaker) record(ok bool, gen uint64, now time.Time) {
	if b.cfg.Disabled {
		return
	}
	var buf [2]transition
	ts := buf[:0]
	b.mu.Lock()
	if gen != b.gen.Load() {
		// Admitted in an earlier state: its outcome says nothing about this one.
		b.mu.Unlock()
		return
	}
	switch from := CircuitState(b.state.Load()); from {
	case Closed:
		if ok {
			b.failures = 0
		} else {
			b.failures++
		}
		trip := b.failures >= b.cfg.FailureThreshold
		if r := b.cfg.FailureRateThreshold; r > 0 {
			b.recent.add(ok, b.cfg.FailureRateWindow)
			trip = trip || !ok && b.recent.full() && float64(b.recent.failed) >= r*float64(len(b.recent.ring))
		}
		if trip {
			ts = b.setLocked(Closed, Open, now, ts)
		}
	case HalfOpen:
		if !ok {
			ts = b.setLocked(HalfOpen, Open, now, ts)
		} else if b.successes++; b.successes >= b.cfg.SuccessThreshold {
			ts = b.setLocked(HalfOpen, Closed, now, ts)
		}
	}
	fn := b.onChange
	b.mu.Unlock()
	notify(fn, ts)
}

// outcomes is a ring of the most recent outcomes while closed, for the failure-rate trigger.
type outcomes struct {
	ring   []bool // true = failure
	next   int
	n      int // filled slots
	failed int // failures among them
}

func (o *outcomes) add(ok bool, size int) {
	if len(o.ring) != size {
		o.ring = make([]bool, size)
		o.next, o.n, o.failed = 0, 0, 0
	}
	if o.n == size && o.ring[o.next] {
		o.failed--
	}
	o.ring[o.next] = !ok
	if !ok {
		o.failed++
	}
	o.next = (o.next + 1) % size
	o.n = min(o.n+1, size)
}

func (o *outcomes) full() bool { return o.n > 0 && o.n == len(o.ring) }

func (o *outcomes) reset() {
	clear(o.ring)
	o.next, o.n, o.failed = 0, 0, 0
}
