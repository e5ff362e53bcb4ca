// Package flow is kvgate's flow control: the bounded per-model queue that holds requests at the
// gateway until some engine can take them (late binding), strict priority bands with aging
// against starvation, weighted fair queueing between tenants within a band, per-tenant token
// buckets, and the saturation judgement that decides when a request may leave the queue.
//
// Everything here is pure logic over an injected clock: no goroutine, no timer, no HTTP. The
// gateway drives it from real time (its dispatcher wakes on completions, load reports and
// deadlines); the fleet simulator drives the same code in virtual time, so a queueing result
// measured in the simulator is the result of the code that serves traffic.
package flow

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"
)

// Priority bounds: a request's priority is clamped into [MinPriority, MaxPriority], so that the
// bands (and the metric label that names them) are at most 21.
const (
	MinPriority = -10
	MaxPriority = 10
)

// Reason says why a request was refused or left the queue without being dispatched. Each is one
// value of the shed counter's reason label.
type Reason string

// The reasons.
const (
	// ReasonQueueFull: the queue holds MaxRequests entries (429).
	ReasonQueueFull Reason = "queue_full"
	// ReasonQueueBytes: the queued bodies would pass MaxBytes (429).
	ReasonQueueBytes Reason = "queue_bytes"
	// ReasonTimeout: the request waited its whole deadline (429, or 503 with an empty pool).
	ReasonTimeout Reason = "timeout"
	// ReasonNoWorker: the pool has no available worker at the deadline (503).
	ReasonNoWorker Reason = "no_worker"
	// ReasonRateRequests: the tenant is over its requests-per-second limit (429).
	ReasonRateRequests Reason = "rate_requests"
	// ReasonRateTokens: the tenant is over its prompt-tokens-per-second limit (429).
	ReasonRateTokens Reason = "rate_tokens"
	// ReasonSLO: the best predicted time to first token already exceeds the request's SLO (429).
	ReasonSLO Reason = "ttft_slo"
	// ReasonShutdown: the gateway stopped while the request was queued (503).
	ReasonShutdown Reason = "shutdown"
)

// Reasons lists every Reason, for metrics that must show each at zero.
var Reasons = []Reason{ReasonQueueFull, ReasonQueueBytes, ReasonTimeout, ReasonNoWorker, ReasonRateRequests, ReasonRateTokens, ReasonSLO, ReasonShutdown}

// OtherTenant is the tenant label of every tenant that is not configured, and the name of the
// Tenant entry whose settings such tenants take ("*" in the flag is this name too).
const OtherTenant = "other"

// Tenant is one configured tenant: the name of a data-plane key, or a value of the trusted
// tenant header.
type Tenant struct {
	// Name is the tenant: the key's name, or the header's value. OtherTenant configures every
	// tenant not named otherwise.
	Name string
	// Weight is the tenant's share within a band, relative to the others' (weighted fair
	// queueing). Default 1; must be in (0, 1000].
	Weight float64
	// Priority is the priority of the tenant's requests that carry none they may set. Default 0;
	// clamped into [MinPriority, MaxPriority].
	Priority int
	// RequestsPerSecond limits the tenant's admitted requests (token bucket, burst of one
	// second's worth, at least one). 0 = no limit.
	RequestsPerSecond float64
	// TokensPerSecond limits the tenant's admitted prompt tokens (estimated from the body's
	// bytes, four to a token; bucket of one second's worth). 0 = no limit. The limit is shared by
	// all the tenants that OtherTenant stands for.
	TokensPerSecond float64
}

// Config configures flow control. The zero value, with Enabled false, is off.
type Config struct {
	// Enabled turns the queue on. Off (the default), every request goes to an engine on arrival,
	// as without flow control.
	Enabled bool
	// MaxRequests bounds the entries of one model's queue (429 queue_full above). Default 1024.
	MaxRequests int
	// MaxBytes bounds the bytes of the request bodies one model's queue holds (429 queue_bytes
	// above). Default 256 MiB.
	MaxBytes int64
	// Timeout is how long a request may wait in the queue (429, or 503 when the pool has no
	// available worker, after it). Default 30s.
	Timeout time.Duration
	// Aging raises a queued request's effective priority by one for every Aging it has waited,
	// so that a lower band is never starved: a request of priority p that has waited
	// (q−p)·Aging longer than the oldest of band q goes first. Default 2s; negative: strict
	// bands without aging.
	Aging time.Duration
	// AgedShare bounds the share of dispatches that aging may give a lower band while a higher
	// band has requests, in (0,1]: a lower band is never starved (it gets at least this share of
	// the capacity while backlogged) and a higher band loses at most this share to it. Default
	// 0.1.
	AgedShare float64
	// Saturation is the point past which an engine takes no more requests from the queue.
	Saturation Saturation
	// Tenants are the configured tenants; any other tenant takes the OtherTenant entry, else
	// weight 1, priority 0 and no limits.
	Tenants []Tenant
}

// DefaultConfig returns the defaults, off.
func DefaultConfig() Config {
	return Config{MaxRequests: 1024, MaxBytes: 256 << 20, Timeout: 30 * time.Second, Aging: 2 * time.Second, AgedShare: 0.1, Saturation: DefaultSaturation()}
}

// WithDefaults returns c with its zero fields at their defaults.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	c.MaxRequests = cmp.Or(c.MaxRequests, d.MaxRequests)
	c.MaxBytes = cmp.Or(c.MaxBytes, d.MaxBytes)
	c.Timeout = cmp.Or(c.Timeout, d.Timeout)
	c.Aging = cmp.Or(c.Aging, d.Aging)
	c.AgedShare = cmp.Or(c.AgedShare, d.AgedShare)
	c.Saturation = c.Saturation.WithDefaults()
	for i := range c.Tenants {
		if c.Tenants[i].Weight == 0 {
			c.Tenants[i].Weight = 1
		}
		c.Tenants[i].Priority = ClampPriority(c.Tenants[i].Priority)
	}
	return c
}

// tenantName is what a tenant's name may be: it becomes a metric label and a log field.
var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidTenantName reports whether s may name a tenant: 1 to 64 letters, digits, '_', '.' or
// '-', starting with a letter or digit.
func ValidTenantName(s string) bool { return tenantName.MatchString(s) }

// Validate reports the first invalid field of c, after defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.MaxRequests < 1 || c.MaxRequests > 1<<20:
		return fmt.Errorf("flow: max queue requests %d is outside [1, 1048576]", c.MaxRequests)
	case c.MaxBytes < 1:
		return fmt.Errorf("flow: max queue bytes %d must be positive", c.MaxBytes)
	case c.Timeout < 0:
		return errors.New("flow: the queue timeout must not be negative")
	case !(c.AgedShare > 0 && c.AgedShare <= 1):
		return fmt.Errorf("flow: the aged share %g is outside (0, 1]", c.AgedShare)
	}
	if err := c.Saturation.Validate(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, t := range c.Tenants {
		switch {
		case !ValidTenantName(t.Name):
			return fmt.Errorf("flow: tenant name %q: want 1-64 letters, digits, '_', '.' or '-'", t.Name)
		case seen[t.Name]:
			return fmt.Errorf("flow: tenant %q is configured twice", t.Name)
		case !(t.Weight > 0 && t.Weight <= 1000):
			return fmt.Errorf("flow: tenant %q: weight %g is outside (0, 1000]", t.Name, t.Weight)
		case !(t.RequestsPerSecond >= 0) || math.IsInf(t.RequestsPerSecond, 0) || !(t.TokensPerSecond >= 0) || math.IsInf(t.TokensPerSecond, 0):
			return fmt.Errorf("flow: tenant %q: rate limits must be finite and not negative", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// ClampPriority returns p clamped into [MinPriority, MaxPriority].
func ClampPriority(p int) int { return min(max(p, MinPriority), MaxPriority) }

// Tenants resolves tenant names to their settings and metric labels. Create it with NewTenants;
// it is immutable and safe for concurrent use.
type Tenants struct {
	byName map[string]*Tenant
	other  Tenant
}

// NewTenants indexes the tenants of c (after defaults).
func NewTenants(c Config) *Tenants {
	c = c.WithDefaults()
	t := &Tenants{byName: make(map[string]*Tenant, len(c.Tenants)), other: Tenant{Name: OtherTenant, Weight: 1}}
	for i := range c.Tenants {
		tn := c.Tenants[i]
		if tn.Name == OtherTenant {
			t.other = tn
			continue
		}
		t.byName[tn.Name] = &tn
	}
	return t
}

// Lookup returns the settings of the tenant name: its own entry, else OtherTenant's. Its Name is
// the tenant's metric label: the name when configured, else OtherTenant.
func (t *Tenants) Lookup(name string) *Tenant {
	if tn, ok := t.byName[name]; ok {
		return tn
	}
	return &t.other
}

// Labels returns every tenant label, configured names first (in no set order) then OtherTenant.
func (t *Tenants) Labels() []string {
	out := make([]string, 0, len(t.byName)+1)
	for n := range t.byName {
		out = append(out, n)
	}
	return append(out, OtherTenant)
}

// ParsePriority parses the x-kvgate-priority header: a decimal integer (sign allowed, at most 8
// characters), clamped into [MinPriority, MaxPriority]. Higher is served first.
func ParsePriority(s string) (int, error) {
	if len(s) == 0 || len(s) > 8 {
		return 0, errors.New("the priority must be an integer")
	}
	neg, i := false, 0
	if s[0] == '-' || s[0] == '+' {
		neg, i = s[0] == '-', 1
	}
	if i == len(s) {
		return 0, errors.New("the priority must be an integer")
	}
	n := 0
	for ; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errors.New("the priority must be an integer")
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return ClampPriority(n), nil
}

// FromVLLMPriority converts the body's "priority" field, whose meaning is vLLM's (lower is
// served first), into a flow priority (higher first): its negation, clamped.
func FromVLLMPriority(p int64) int {
	return ClampPriority(int(-max(min(p, 1<<20), -(1 << 20))))
}
