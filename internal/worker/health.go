package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// HealthConfig configures active health checks. Zero fields take the defaults of
// DefaultHealthConfig.
type HealthConfig struct {
	// Path is the route probed with GET; a 2xx answer is a success. Default "/health".
	Path string `yaml:"path"`
	// Interval is the time between two checks of one worker. Default 10s.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one check; a check that takes longer fails. Default 5s.
	Timeout time.Duration `yaml:"timeout"`
	// SuccessThreshold is the consecutive successes that make a worker ready. Default 2.
	SuccessThreshold int `yaml:"success_threshold"`
	// FailureThreshold is the consecutive failures that make it not ready. Default 3.
	FailureThreshold int `yaml:"failure_threshold"`
	// Disabled turns checks off: workers are then taken as ready.
	Disabled bool `yaml:"disabled"`
}

// DefaultHealthConfig returns the defaults of the reference gateway: GET /health every 10s, 5s timeout,
// 2 successes to become ready, 3 failures to become not ready.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{Path: "/health", Interval: 10 * time.Second, Timeout: 5 * time.Second, SuccessThreshold: 2, FailureThreshold: 3}
}

func (c HealthConfig) withDefaults() HealthConfig {
	d := DefaultHealthConfig()
	c.Path = cmp.Or(c.Path, d.Path)
	c.Interval = cmp.Or(max(c.Interval, 0), d.Interval)
	c.Timeout = cmp.Or(max(c.Timeout, 0), d.Timeout)
	c.SuccessThreshold = cmp.Or(max(c.SuccessThreshold, 0), d.SuccessThreshold)
	c.FailureThreshold = cmp.Or(max(c.FailureThreshold, 0), d.FailureThreshold)
	return c
}

// Validate reports the first invalid field; zero values are valid (they mean the default).
func (c HealthConfig) Validate() error {
	switch {
	case c.Path != "" && !strings.HasPrefix(c.Path, "/"):
		return fmt.Errorf("health check path %q must start with /", c.Path)
	case c.Interval < 0 || c.Timeout < 0:
		return errors.New("health check interval and timeout must not be negative")
	case c.SuccessThreshold < 0 || c.FailureThreshold < 0:
		return errors.New("health check thresholds must not be negative")
	}
	return nil
}

// Worker labels that override the gateway-wide health-check settings for one worker. Their names
// are the flag names with underscores.
const (
	LabelHealthPath             = "health_check_path"
	LabelHealthInterval         = "health_check_interval"
	LabelHealthTimeout          = "health_check_timeout"
	LabelHealthSuccessThreshold = "health_success_threshold"
	LabelHealthFailureThreshold = "health_failure_threshold"
	LabelHealthDisabled         = "disable_health_check"
)

// WithLabels returns c overridden by the worker labels health_check_path, health_check_interval,
// health_check_timeout (Go durations), health_success_threshold, health_failure_threshold and
// disable_health_check; absent labels keep c's value. It fails on a value that does not parse or
// lies outside its bounds (interval 1s–1h, timeout 100ms–5m, thresholds 1–10000).
func (c HealthConfig) WithLabels(labels map[string]string) (HealthConfig, error) {
	if p, ok := labels[LabelHealthPath]; ok {
		c.Path = strings.TrimSpace(p)
		if len(c.Path) > 256 || strings.ContainsAny(c.Path, "?# \t\r\n") {
			return c, fmt.Errorf("label %s=%q: want a path of at most 256 bytes, without query or spaces", LabelHealthPath, p)
		}
	}
	if err := boundedDurationLabel(labels, LabelHealthInterval, &c.Interval, time.Second, time.Hour); err != nil {
		return c, err
	}
	if err := boundedDurationLabel(labels, LabelHealthTimeout, &c.Timeout, 100*time.Millisecond, 5*time.Minute); err != nil {
		return c, err
	}
	if err := boundedIntLabel(labels, LabelHealthSuccessThreshold, &c.SuccessThreshold); err != nil {
		return c, err
	}
	if err := boundedIntLabel(labels, LabelHealthFailureThreshold, &c.FailureThreshold); err != nil {
		return c, err
	}
	if err := boolLabel(labels, LabelHealthDisabled, &c.Disabled); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// ProbeFunc checks worker w once by GET path; nil error is a success. It must return when ctx
// ends.
type ProbeFunc func(ctx context.Context, w *Worker, path string) error

// CheckerOptions are a Checker's collaborators. The zero value is usable.
type CheckerOptions struct {
	// Probe checks one worker; nil means an HTTP GET with Client that wants a 2xx answer.
	Probe ProbeFunc
	// Client sends the default probe; nil means a client of the checker's own, whose idle
	// connections Stop closes and which follows redirects only on the worker's own origin
	// (CheckRedirect).
	Client *http.Client
	// Logger receives one line per health transition; nil means slog.Default().
	Logger *slog.Logger
	// OnTransition, when set, is told of every health transition the checker makes, after it
	// is logged. It runs on the checker's goroutine and must not block.
	OnTransition func(w *Worker, from, to Health)
	// MaxConcurrent bounds the checks in flight at once. Default 64.
	MaxConcurrent int
}

// Checker actively checks every registered worker's health and moves it between pending, ready
// and not_ready. One owner goroutine (started by Start, ended by Stop) schedules the checks and
// owns all their bookkeeping; each check runs on a short-lived goroutine, at most MaxConcurrent at
// once and at most one per worker. It follows the registry: it reads the current View on each
// pass and is woken by registrations. The zero value is not usable; use NewChecker.
type Checker struct {
	reg  *Registry
	cfg  HealthConfig
	opts CheckerOptions
	log  *slog.Logger
	own  *http.Transport // the default probe's transport, nil with a custom client or probe

	kick chan struct{}
	mu   sync.Mutex // guards stop and done
	stop context.CancelFunc
	done chan struct{}
}

// NewChecker returns a checker of reg's workers; Start runs it.
func NewChecker(reg *Registry, cfg HealthConfig, opts CheckerOptions) *Checker {
	c := &Checker{reg: reg, cfg: cfg.withDefaults(), opts: opts, log: opts.Logger, kick: make(chan struct{}, 1)}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.opts.MaxConcurrent <= 0 {
		c.opts.MaxConcurrent = 64
	}
	if c.opts.Probe == nil {
		if c.opts.Client == nil {
			c.own = &http.Transport{
				DialContext:         (&net.Dialer{Timeout: c.cfg.Timeout}).DialContext,
				MaxIdleConnsPerHost: 1,
				IdleConnTimeout:     3 * c.cfg.Interval,
			}
			c.opts.Client = &http.Client{Transport: c.own, CheckRedirect: CheckRedirect}
		}
		c.opts.Probe = c.httpProbe
	}
	reg.Subscribe(func(Event) {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	})
	return c
}

// Start runs the checker until ctx ends or Stop is called. Starting twice does nothing.
func (c *Checker) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return
	}
	ctx, c.stop = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go c.run(ctx, c.done)
}

// Stop ends the checker and waits until its goroutines have exited. It is idempotent and may be
// called without Start.
func (c *Checker) Stop() {
	c.mu.Lock()
	stop, done := c.stop, c.done
	c.mu.Unlock()
	if done == nil {
		return
	}
	stop()
	<-done
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// checkState is the owner goroutine's bookkeeping for one worker.
type checkState struct {
	cfg       HealthConfig
	next      time.Time // when the next check is due
	inflight  bool
	successes int
	failures  int
}

// result is one finished check.
type result struct {
	w   *Worker
	err error
	at  time.Time // when the check started
}

// run is the owner goroutine.
func (c *Checker) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan result)
	states := map[*Worker]*checkState{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	running := 0
	for {
		now := time.Now()
		c.sync(states, now)
		var wake time.Time
		for w, st := range states {
			if st.cfg.Disabled || st.inflight {
				continue
			}
			if !st.next.After(now) {
				if running < c.opts.MaxConcurrent {
					st.inflight, running = true, running+1
					wg.Add(1)
					go func() { defer wg.Done(); c.check(ctx, w, st.cfg, now, results) }()
				}
				continue // due: started now, or when a running check returns
			}
			if wake.IsZero() || st.next.Before(wake) {
				wake = st.next
			}
		}
		var tick <-chan time.Time
		if !wake.IsZero() {
			timer.Reset(max(wake.Sub(now), time.Millisecond))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case r := <-results:
			running--
			if st := states[r.w]; st != nil {
				st.inflight = false
				st.next = r.at.Add(st.cfg.Interval)
				c.apply(r.w, st, r.err)
			}
		case <-c.kick:
		case <-tick:
		}
		timer.Stop()
	}
}

// sync adds the registry's new workers (due at once) and forgets removed ones.
func (c *Checker) sync(states map[*Worker]*checkState, now time.Time) {
	all := c.reg.View().All
	if len(states) > len(all) || !allKnown(states, all) {
		live := make(map[*Worker]bool, len(all))
		for _, w := range all {
			live[w] = true
		}
		for w := range states {
			if !live[w] {
				delete(states, w)
			}
		}
	}
	for _, w := range all {
		if states[w] != nil {
			continue
		}
		cfg, err := c.cfg.WithLabels(w.Spec.Labels)
		if err != nil {
			c.log.Warn("ignoring the worker's health-check labels", "worker", w.ID, "err", err)
			cfg = c.cfg
		}
		states[w] = &checkState{cfg: cfg.withDefaults(), next: now}
		if cfg.Disabled && w.Health() != Ready {
			c.transition(w, Ready, "health checks disabled")
		}
	}
}

func allKnown(states map[*Worker]*checkState, all []*Worker) bool {
	for _, w := range all {
		if states[w] == nil {
			return false
		}
	}
	return true
}

// check runs one probe of w and hands the result to the owner.
func (c *Checker) check(ctx context.Context, w *Worker, cfg HealthConfig, at time.Time, results chan<- result) {
	pctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	err := c.opts.Probe(pctx, w, cfg.Path)
	if err == nil && pctx.Err() != nil {
		err = pctx.Err()
	}
	cancel()
	select {
	case results <- result{w: w, err: err, at: at}:
	case <-ctx.Done():
	}
}

// apply counts one check's outcome and moves w's health when a threshold is reached.
func (c *Checker) apply(w *Worker, st *checkState, err error) {
	cur := w.Health()
	if err == nil {
		st.successes, st.failures = st.successes+1, 0
		if cur != Ready && st.successes >= st.cfg.SuccessThreshold {
			c.transition(w, Ready, fmt.Sprintf("%d consecutive checks passed", st.successes))
		}
		return
	}
	st.successes, st.failures = 0, st.failures+1
	c.log.Debug("health check failed", "worker", w.ID, "failures", st.failures, "err", err)
	if cur != NotReady && st.failures >= st.cfg.FailureThreshold {
		c.transition(w, NotReady, fmt.Sprintf("%d consecutive checks failed, last: %v", st.failures, err))
	}
}

// transition moves w to health to, logging and reporting it once.
func (c *Checker) transition(w *Worker, to Health, reason string) {
	from := w.Health()
	if !w.SetHealth(to) {
		return
	}
	lvl := slog.LevelInfo
	if to != Ready {
		lvl = slog.LevelWarn
	}
	c.log.Log(context.Background(), lvl, "worker health changed", "worker", w.ID, "url", w.Spec.URL,
		"from", from.String(), "to", to.String(), "reason", reason)
	if c.opts.OnTransition != nil {
		c.opts.OnTransition(w, from, to)
	}
}

// httpProbe is the default probe: GET base+path, a 2xx is a success.
func (c *Checker) httpProbe(ctx context.Context, w *Worker, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL.String()+path, nil)
	if err != nil {
		return err
	}
	if w.Spec.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+w.Spec.APIKey)
	}
	resp, err := c.opts.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s answered %d", path, resp.StatusCode)
	}
	return nil
}
