package flow

import (
	"math"
	"sync"
	"time"
)

// bucket is a token bucket that may go into debt: a request is admitted when the bucket holds
// what it costs, or is full (so that one prompt larger than the burst is not refused forever),
// and its whole cost is taken.
type bucket struct {
	rate, burst, level float64
	last               time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	burst := max(rate, 1)
	return &bucket{rate: rate, burst: burst, level: burst, last: now}
}

func (b *bucket) refill(now time.Time) {
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.level = min(b.burst, b.level+dt*b.rate)
	}
	if now.After(b.last) {
		b.last = now
	}
}

// wait returns how long until n can be taken; 0 when it can be now.
func (b *bucket) wait(n float64) time.Duration {
	need := min(n, b.burst)
	if b.level >= need {
		return 0
	}
	return time.Duration(math.Ceil((need - b.level) / b.rate * float64(time.Second)))
}

// tenantBuckets are one tenant's limits; a nil bucket is no limit.
type tenantBuckets struct {
	requests, tokens *bucket
}

// Limiter applies the tenants' rate limits (Tenant.RequestsPerSecond, Tenant.TokensPerSecond).
// Create it with NewLimiter; it is safe for concurrent use.
type Limiter struct {
	mu      sync.Mutex
	tenants *Tenants
	buckets map[*Tenant]*tenantBuckets
}

// NewLimiter returns the limiter of the tenants' limits, full at now.
func NewLimiter(t *Tenants, now time.Time) *Limiter {
	l := &Limiter{tenants: t, buckets: map[*Tenant]*tenantBuckets{}}
	add := func(tn *Tenant) {
		if tn.RequestsPerSecond == 0 && tn.TokensPerSecond == 0 {
			return
		}
		tb := &tenantBuckets{}
		if tn.RequestsPerSecond > 0 {
			tb.requests = newBucket(tn.RequestsPerSecond, now)
		}
		if tn.TokensPerSecond > 0 {
			tb.tokens = newBucket(tn.TokensPerSecond, now)
		}
		l.buckets[tn] = tb
	}
	for _, tn := range t.byName {
		add(tn)
	}
	add(&t.other)
	return l
}

// Active reports whether any tenant has a limit; a Limiter without one admits everything and
// need not be called.
func (l *Limiter) Active() bool { return len(l.buckets) > 0 }

// Allow admits one request of tenant (as resolved by Tenants.Lookup) with tokens prompt tokens at
// now, taking its cost from both buckets; or refuses it, taking nothing, with the limit it is
// over and how long until it would pass.
func (l *Limiter) Allow(tenant *Tenant, tokens float64, now time.Time) (ok bool, reason Reason, retry time.Duration) {
	tb := l.buckets[tenant]
	if tb == nil {
		return true, "", 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := tb.requests; b != nil {
		b.refill(now)
		if d := b.wait(1); d > 0 {
			return false, ReasonRateRequests, d
		}
	}
	if b := tb.tokens; b != nil {
		b.refill(now)
		if d := b.wait(tokens); d > 0 {
			return false, ReasonRateTokens, d
		}
	}
	if tb.requests != nil {
		tb.requests.level--
	}
	if tb.tokens != nil {
		tb.tokens.level -= tokens
	}
	return true, "", 0
}
