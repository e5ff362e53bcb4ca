package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

func readyWorkers(t testing.TB, n int) []*worker.Worker {
	t.Helper()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), Models: []string{"m"}}, worker.BreakerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		ws[i] = w
	}
	return ws
}

// fixedLoads reports a fixed load per worker index.
type fixedLoads map[*worker.Worker]int64

func (f fixedLoads) Load(w *worker.Worker) int64                  { return f[w] }
func (f fixedLoads) Report(*worker.Worker) (loadmon.Report, bool) { return loadmon.Report{}, false }

func seeded(seed uint64) func(int) int {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return func(n int) int { mu.Lock(); defer mu.Unlock(); return r.IntN(n) }
}

func TestSimplePolicyDistributions(t *testing.T) {
	const picks = 4000
	cases := []struct {
		name  string
		build func(ws []*worker.Worker) Policy
		check func(t *testing.T, counts []int)
	}{
		{name: "round_robin is exactly even", build: func([]*worker.Worker) Policy { return NewRoundRobin() },
			check: func(t *testing.T, c []int) {
				for i, n := range c {
					if n != picks/len(c) {
						t.Errorf("worker %d got %d, want %d", i, n, picks/len(c))
					}
				}
			}},
		{name: "random is near uniform", build: func([]*worker.Worker) Policy { return NewRandom(Config{Rand: seeded(1)}) },
			check: func(t *testing.T, c []int) {
				for i, n := range c {
					if n < picks/len(c)*8/10 || n > picks/len(c)*12/10 {
						t.Errorf("worker %d got %d of %d", i, n, picks)
					}
				}
			}},
		{name: "power_of_two prefers the less loaded", build: func(ws []*worker.Worker) Policy {
			return NewPowerOfTwo(Config{Rand: seeded(2), Loads: fixedLoads{ws[0]: 0, ws[1]: 5, ws[2]: 10, ws[3]: 50}})
		}, check: func(t *testing.T, c []int) {
			// Sampling two of four, the least loaded wins every pair it is in: 1/2 of picks;
			// the most loaded never wins.
			if c[3] != 0 {
				t.Errorf("the most loaded worker was picked %d times", c[3])
			}
			if !(c[0] > c[1] && c[1] > c[2]) {
				t.Errorf("counts %v do not fall with load", c)
			}
			if c[0] < picks*45/100 || c[0] > picks*55/100 {
				t.Errorf("least loaded got %d of %d, want about half", c[0], picks)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := readyWorkers(t, 4)
			p := tc.build(ws)
			counts := make([]int, len(ws))
			for i := 0; i < picks; i++ {
				w := p.Pick(context.Background(), ws, &Request{})
				for j := range ws {
					if ws[j] == w {
						counts[j]++
					}
				}
			}
			tc.check(t, counts)
		})
	}
}

func TestSimplePoliciesSkipUnavailable(t *testing.T) {
	for _, name := range []string{"random", "round_robin", "power_of_two"} {
		t.Run(name, func(t *testing.T) {
			ws := readyWorkers(t, 3)
			ws[0].SetHealth(worker.NotReady)
			ws[2].Drain()
			p, err := New(name, DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 50; i++ {
				if got := p.Pick(context.Background(), ws, &Request{}); got != ws[1] {
					t.Fatalf("picked %v, want the only available worker", got)
				}
			}
			ws[1].SetHealth(worker.NotReady)
			if got := p.Pick(context.Background(), ws, &Request{}); got != nil {
				t.Fatal("picked an unavailable worker")
			}
		})
	}
}

func TestRegistryNamesAndAliases(t *testing.T) {
	cases := map[string]string{"round-robin": "round_robin", "RR": "round_robin", "p2c": "power_of_two", "random": "random"}
	for alias, want := range cases {
		if got, err := Canonical(alias); err != nil || got != want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", alias, got, err, want)
		}
	}
	if _, err := New("nope", DefaultConfig()); err == nil {
		t.Error("unknown policy accepted")
	}
	if _, err := NewRouter("nope", DefaultConfig()); err == nil {
		t.Error("router accepted an unknown default policy")
	}
	bad := DefaultConfig()
	bad.CacheAware.CacheThreshold = 2
	if _, err := NewRouter("random", bad); err == nil {
		t.Error("router accepted an invalid config")
	}
}

func TestRouterPerModelLabel(t *testing.T) {
	r, err := NewRouter("random", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg := worker.NewRegistry()
	r.Attach(reg)
	w, _ := worker.New(worker.Spec{URL: "http://127.0.0.1:1", Models: []string{"a"}, Labels: map[string]string{"policy": "Round-Robin"}}, worker.BreakerConfig{})
	reg.Add(w)
	p, err := r.For("a", worker.Regular)
	if err != nil || p.Name() != "round_robin" {
		t.Fatalf("labelled model got %v, %v", p, err)
	}
	q, _ := r.For("b", worker.Regular)
	if q.Name() != "random" {
		t.Errorf("unlabelled model got %s", q.Name())
	}
	if again, _ := r.For("a", worker.Regular); again != p {
		t.Error("a model's policy was rebuilt")
	}
	if r.LoadAware() {
		t.Error("random and round_robin are not load-aware")
	}
}
