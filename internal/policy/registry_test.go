package policy

import (
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// loadsOf returns the load view a load-aware policy reads.
func loadsOf(t *testing.T, p Policy) Loads {
	t.Helper()
	switch x := p.(type) {
	case *CacheAware:
		return x.loads
	case *PowerOfTwo:
		return x.loads
	case *LeastLoad:
		return x.loads
	case *PrefixHash:
		return x.loads
	}
	t.Fatalf("%T is not a load-aware policy", p)
	return nil
}

// TestEveryCreationPathGetsTheLoadView builds load-aware policies every way a gateway can — the
// default policy, a per-model label, an alias, prefill/decode pools — and checks each reads the
// configured load view, never a private local one.
func TestEveryCreationPathGetsTheLoadView(t *testing.T) {
	view := fixedLoads{}
	cfg := DefaultConfig()
	cfg.Loads = view
	cfg.NoBackground = true
	r, err := NewRouter("cache-aware", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	labelled := func(name string) *worker.Worker {
		w, _ := worker.New(worker.Spec{URL: "http://127.0.0.1:1", Labels: map[string]string{PolicyLabel: name}}, worker.BreakerConfig{})
		return w
	}
	cases := []struct {
		name, model string
		first       *worker.Worker
		want        string
	}{
		{"default policy by alias", "default-model", nil, "cache_aware"},
		{"label, canonical name", "labelled", labelled("cache_aware"), "cache_aware"},
		{"label, alias", "aliased", labelled("cacheaware"), "cache_aware"},
		{"label, power_of_two", "p2c", labelled("p2c"), "power_of_two"},
		{"label, least_load", "least", labelled("least-load"), "least_load"},
		{"label, prefix_hash", "ph", labelled("prefix-hash"), "prefix_hash"},
		{"prefill pool", "m#prefill", labelled("cache_aware"), "cache_aware"},
		{"decode pool", "m#decode", nil, "cache_aware"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := r.For(tc.model, tc.first)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tc.want {
				t.Fatalf("policy %s, want %s", p.Name(), tc.want)
			}
			if got, ok := loadsOf(t, p).(fixedLoads); !ok || got == nil {
				t.Errorf("%s reads %T, not the configured load view", p.Name(), loadsOf(t, p))
			}
		})
	}
	if !r.LoadAware() {
		t.Error("the router does not report itself load-aware")
	}
}
