package flow

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// bucket is a token bucket (golang.org/x/time/rate's) that may go into debt: a request is
// admitted when the bucket holds what it costs, or is full (so that one prompt larger than the
// burst is not refused forever), and its whole cost is taken. The rate.Limiter counts in
// thousandths (bucketScale), so that a fractional cost (prompt tokens estimated from bytes) is
// taken to a thousandth of a token.
type bucket struct {
	lim         *rate.Limiter
	rate, burst float64 // per second, and the burst, in whole units
}

// bucketScale is the rate.Limiter's units per bucket unit.
const bucketScale = 1000

func newBucket(r float64, now time.Time) *bucket {
	burst := max(r, 1)
	lim := rate.NewLimiter(rate.Limit(r*bucketScale), int(math.Ceil(burst*bucketScale)))
	lim.AllowN(now, 0) // full at now
	return &bucket{lim: lim, rate: r, burst: burst}
}

// wait returns how long after now until n can be taken; 0 when it can be now.
func (b *bucket) wait(n float64, now time.Time) time.Duration {
	need := min(n, b.burst)
	level := b.lim.TokensAt(now) / bucketScale
	if level >= need {
		return 0
	}
	return time.Duration(math.Ceil((need - level) / b.rate * float64(time.Second)))
}

// take takes n at now, into debt where the bucket holds less: in reservations of at most the
// burst, the most a rate.Limiter reserves at once.
func (b *bucket) take(n float64, now time.Time) {
	left := int64(math.Round(n * bucketScale))
	for burst := int64(b.lim.Burst()); left > 0; left -= burst {
		b.lim.ReserveN(now, int(min(left, burst)))
	}
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
		if d := b.wait(1, now); d > 0 {
			return false, ReasonRateRequests, d
		}
	}
	if b := tb.tokens; b != nil {
		if d := b.wait(tokens, now); d > 0 {
			return false, ReasonRateTokens, d
		}
	}
	// Both pass: take from both, under the lock, so that no other request slips between.
	if tb.requests != nil {
		tb.requests.take(1, now)
	}
	if tb.tokens != nil {
		tb.tokens.take(tokens, now)
	}
	return true, "", 0
}
