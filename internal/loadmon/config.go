package loadmon

import (
	"cmp"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Config configures a Monitor. Every zero field takes its default, so Config{} is valid;
// DefaultConfig spells the defaults out.
type Config struct {
	// Interval is how often every ready worker is polled (--load-monitor-interval). Zero means 1s.
	Interval time.Duration
	// Timeout bounds one worker's poll, all its requests included (runtime probe, /v1/loads,
	// /metrics fallback); it must not exceed Interval. Zero means min(500ms, Interval/2).
	Timeout time.Duration
	// StaleAfter is the age (now − PolledAt) past which a worker's entry no longer counts; it
	// must be at least Interval. Zero means 3 × Interval.
	StaleAfter time.Duration
	// Mode is how Load combines local and reported load. Zero is ModeEffective.
	Mode Mode
	// MaxBody is the most bytes read from one /v1/loads, /metrics or /v1/models response; a
	// larger body fails the poll. Zero means 4 MiB.
	MaxBody int
	// Concurrency is how many polls run at once. Zero means 64. Polls mostly wait on the network,
	// so this bounds sockets and goroutines rather than CPU.
	Concurrency int
	// Transport sends the polls. nil (the default) means the monitor's own NewTransport, whose
	// idle connections Stop closes; a caller's Transport is the caller's to close (tests inject
	// transports this way). The monitor calls it directly, not through an http.Client: it
	// follows a worker's redirects itself, on the worker's own scheme and host only.
	Transport http.RoundTripper
	// Now is the clock for PolledAt and freshness; nil means time.Now.
	Now func() time.Time
	// Logger receives poll-state transitions (a worker starts or stops failing, a runtime is
	// learned); nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults (the reference gateway's, with a 1 s interval): poll every 1s, 500ms per poll (Timeout zero),
// stale after 3s (StaleAfter zero), scaled effective load (see ModeScaled), 4 MiB bodies, 64 polls at once.
func DefaultConfig() Config {
	return Config{
		Interval:    time.Second,
		Mode:        ModeScaled,
		MaxBody:     4 << 20,
		Concurrency: 64,
	}
}

// Validate reports the first invalid field, after zero fields took their defaults.
func (c *Config) Validate() error {
	d := c.withDurations()
	switch {
	case d.Interval < 0:
		return errors.New("load monitor interval must be >= 0")
	case d.Timeout < 0 || d.Timeout > d.Interval:
		return errors.New("load monitor timeout must be in [0, interval]")
	case d.StaleAfter < d.Interval:
		return errors.New("load monitor stale-after must be 0 or >= the interval")
	case d.Mode > ModeScaled:
		return errors.New("unknown load mode")
	case d.MaxBody < 0:
		return errors.New("load monitor max body must be >= 0")
	case d.Concurrency < 0:
		return errors.New("load monitor concurrency must be >= 0")
	}
	return nil
}

// NewTransport returns the transport a Monitor uses when Config.Transport is nil: keep-alive
// connections (a few idle ones per worker, so each poll reuses one), no proxy, bounded dials.
// Deadlines come from each poll's context.
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0, // no global cap: one idle connection per worker is the point
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		// 4 KiB, not more: the headers and the start of a body come through the buffer, and
		// the rest of a 28 KB /metrics page is read straight into the poller's own buffer
		// (bufio skips its buffer for large reads), so a 64 KiB buffer cost no less CPU
		// (paired runs of the poll-cost test, docs/benchmarks.md) and held 60 KiB more per
		// worker: 60 MB at 1000 workers. A GET needs no large write buffer.
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 1 << 10,
		// No "Accept-Encoding: gzip": SGLang's /metrics and older vLLM's (prometheus_client's
		// ASGI app) gzip their page when asked, which costs the engine a compression and the
		// gateway an inflate of the whole page at every poll, more CPU than reading the plain
		// page on a datacenter link. (Current vLLM serves /metrics uncompressed either way.) A
		// worker that compresses unasked is still understood (fetch).
		DisableCompression: true,
	}
}

// withDurations replaces zero durations and sizes by their defaults.
func (c Config) withDurations() Config {
	c.Interval = cmp.Or(c.Interval, time.Second)
	c.Timeout = cmp.Or(c.Timeout, max(min(500*time.Millisecond, c.Interval/2), time.Millisecond))
	c.StaleAfter = cmp.Or(c.StaleAfter, 3*c.Interval)
	c.MaxBody = cmp.Or(c.MaxBody, 4<<20)
	c.Concurrency = cmp.Or(c.Concurrency, 64)
	return c
}

// withDefaults resolves every zero field, the injected dependencies included.
func (c Config) withDefaults() Config {
	c = c.withDurations()
	if c.Transport == nil {
		c.Transport = NewTransport()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
