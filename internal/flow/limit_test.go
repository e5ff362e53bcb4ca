package flow

import (
	"testing"
	"time"
)

func TestLimiterRequestsAndTokens(t *testing.T) {
	ts := NewTenants(Config{Tenants: []Tenant{{Name: "a", RequestsPerSecond: 2}, {Name: "b", TokensPerSecond: 1000}}})
	l := NewLimiter(ts, t0)
	a, b, other := ts.Lookup("a"), ts.Lookup("b"), ts.Lookup("nobody")
	if other.Name != OtherTenant {
		t.Fatalf("unknown tenant label %q", other.Name)
	}
	for i := 0; i < 2; i++ {
		if ok, _, _ := l.Allow(a, 10, t0); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, reason, retry := l.Allow(a, 10, t0)
	if ok || reason != ReasonRateRequests || retry != 500*time.Millisecond {
		t.Fatalf("third: %v %s %v; want refused, rate_requests, 500ms", ok, reason, retry)
	}
	if ok, _, _ := l.Allow(a, 10, t0.Add(500*time.Millisecond)); !ok {
		t.Error("not refilled after Retry-After")
	}
	// A prompt larger than the burst passes on a full bucket, then the debt holds the next.
	if ok, _, _ := l.Allow(b, 5000, t0); !ok {
		t.Fatal("large prompt on a full bucket refused")
	}
	ok, reason, retry = l.Allow(b, 10, t0.Add(time.Second))
	if ok || reason != ReasonRateTokens || retry != 3010*time.Millisecond {
		t.Fatalf("after the debt: %v %s %v; want refused for 3.01s", ok, reason, retry)
	}
	for i := 0; i < 100; i++ {
		if ok, _, _ := l.Allow(other, 1e6, t0); !ok {
			t.Fatal("a tenant without limits refused")
		}
	}
}

// TestLimiterRefusalTakesNothing: a request refused by the token limit takes nothing from the
// request limit, and one refused by the request limit nothing from the token limit.
func TestLimiterRefusalTakesNothing(t *testing.T) {
	ts := NewTenants(Config{Tenants: []Tenant{{Name: "a", RequestsPerSecond: 10, TokensPerSecond: 100}}})
	l := NewLimiter(ts, t0)
	a := ts.Lookup("a")
	if ok, _, _ := l.Allow(a, 100, t0); !ok {
		t.Fatal("first refused")
	}
	// Half a second on, the request bucket is full again (10) and the token bucket holds 50:
	// a prompt of 80 tokens is over the token limit.
	now := t0.Add(500 * time.Millisecond)
	if ok, r, _ := l.Allow(a, 80, now); ok || r != ReasonRateTokens {
		t.Fatalf("got %v %s, want refused by the token limit", ok, r)
	}
	// The refusal took no request: all 10 of the burst pass (at no token cost), the 11th not.
	for i := range 10 {
		if ok, r, _ := l.Allow(a, 0, now); !ok {
			t.Fatalf("request %d of the burst refused (%s): the token refusal took a request", i, r)
		}
	}
	if ok, r, _ := l.Allow(a, 0, now); ok || r != ReasonRateRequests {
		t.Fatalf("11th request: %v %s, want refused by the request limit", ok, r)
	}
	// Refused by the request limit: the 50 tokens are still there for the next second's request.
	if ok, _, _ := l.Allow(a, 50, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("the request refusal took tokens")
	}
}

func TestSaturation(t *testing.T) {
	s := Saturation{MaxWaiting: 2, MaxKVUsage: 0.9, MaxPredictedWait: 2 * time.Second, DefaultSlots: 8}.WithDefaults()
	cases := []struct {
		name     string
		sig      Signals
		headroom float64
		level    float64
	}{
		{"unavailable", Signals{}, 0, 1},
		{"no report", Signals{Available: true, Inflight: 3}, 7, 0.3},
		{"learned slots", Signals{Available: true, HasReport: true, Running: 4, Waiting: 1, SentSince: 1, Slots: 4}, 0, 1},
		{"finished since", Signals{Available: true, HasReport: true, Running: 4, Waiting: 1, SentSince: -2, Slots: 4}, 3, 0.5},
		{"kv full", Signals{Available: true, HasReport: true, KVUsage: 0.95}, 0, 1},
		{"kv half", Signals{Available: true, HasReport: true, KVUsage: 0.45}, 10, 0.5},
		{"predicted wait", Signals{Available: true, HasWait: true, PredictedWait: 2}, 0, 1},
		{"short wait", Signals{Available: true, HasWait: true, PredictedWait: 0.5}, 10, 0.25},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := s.Headroom(c.sig); got != c.headroom {
				t.Errorf("headroom %g, want %g", got, c.headroom)
			}
			if got := s.Level(c.sig); got != c.level {
				t.Errorf("level %g, want %g", got, c.level)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{MaxRequests: -1},
		{Tenants: []Tenant{{Name: "bad name"}}},
		{Tenants: []Tenant{{Name: "a"}, {Name: "a"}}},
		{Tenants: []Tenant{{Name: "a", Weight: -1}}},
		{Saturation: Saturation{MaxKVUsage: 2}},
	}
	for i, c := range bad {
		if c.Validate() == nil {
			t.Errorf("config %d accepted", i)
		}
	}
	if err := (Config{Enabled: true, Tenants: []Tenant{{Name: "a", Weight: 3}, {Name: OtherTenant}}}).Validate(); err != nil {
		t.Error(err)
	}
}
