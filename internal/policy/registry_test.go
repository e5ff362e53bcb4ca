package policy

import (
	"fmt"
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
	case *Cost:
		return x.sc.loads
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
	reg := worker.NewRegistry()
	r.Attach(reg)
	port := 0
	add := func(model string, typ worker.Type, label string) {
		port++
		spec := worker.Spec{URL: fmt.Sprintf("http://127.0.0.1:%d", port), Models: []string{model}, Type: typ}
		if label != "" {
			spec.Labels = map[string]string{PolicyLabel: label}
		}
		w, _ := worker.New(spec, worker.BreakerConfig{})
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name, model string
		role        worker.Type
		label       string
		want        string
	}{
		{"default policy by alias", "default-model", worker.Regular, "", "cache_aware"},
		{"label, canonical name", "labelled", worker.Regular, "cache_aware", "cache_aware"},
		{"label, alias", "aliased", worker.Regular, "cacheaware", "cache_aware"},
		{"label, power_of_two", "p2c", worker.Regular, "p2c", "power_of_two"},
		{"label, least_load", "least", worker.Regular, "least-load", "least_load"},
		{"label, the default", "cah", worker.Regular, "cost", "cache_aware_hash"},
		{"label, precise", "precise", worker.Regular, "precise", "precise_prefix"},
		{"label, prefix_hash", "ph", worker.Regular, "prefix-hash", "prefix_hash"},
		{"prefill pool", "m", worker.Prefill, "cache_aware", "cache_aware"},
		{"decode pool", "m", worker.Decode, "", "cache_aware"},
	}
	for _, tc := range cases {
		add(tc.model, tc.role, tc.label)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := r.For(tc.model, tc.role)
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
