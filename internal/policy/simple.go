package policy

import (
	"context"
	"sync/atomic"

	"github.com/kvgate/kvgate/internal/worker"
)

// available appends the available candidates to dst.
func available(dst, candidates []*worker.Worker) []*worker.Worker {
	for _, w := range candidates {
		if w.Available() {
			dst = append(dst, w)
		}
	}
	return dst
}

// Random picks uniformly among available workers.
type Random struct{ rand func(int) int }

var _ Policy = (*Random)(nil)

// NewRandom returns a Random policy using cfg.Rand.
func NewRandom(cfg Config) *Random { return &Random{rand: cfg.withDefaults().Rand} }

// Name returns "random".
func (*Random) Name() string { return "random" }

// Pick returns a uniformly random available worker.
func (p *Random) Pick(_ context.Context, candidates []*worker.Worker, _ *Request) *worker.Worker {
	var buf [16]*worker.Worker
	av := available(buf[:0], candidates)
	if len(av) == 0 {
		return nil
	}
	return av[p.rand(len(av))]
}

// RoundRobin cycles through the available workers.
type RoundRobin struct{ next atomic.Uint64 }

var _ Policy = (*RoundRobin)(nil)

// NewRoundRobin returns a RoundRobin policy.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Name returns "round_robin".
func (*RoundRobin) Name() string { return "round_robin" }

// Pick returns the next available worker in candidate order.
func (p *RoundRobin) Pick(_ context.Context, candidates []*worker.Worker, _ *Request) *worker.Worker {
	n := len(candidates)
	if n == 0 {
		return nil
	}
	start := p.next.Add(1) - 1
	for i := 0; i < n; i++ {
		if w := candidates[(start+uint64(i))%uint64(n)]; w.Available() {
			return w
		}
	}
	return nil
}

// PowerOfTwo samples two distinct available workers and takes the less loaded.
type PowerOfTwo struct {
	rand  func(int) int
	loads Loads
}

var _ Policy = (*PowerOfTwo)(nil)

// NewPowerOfTwo returns a PowerOfTwo policy reading cfg.Loads.
func NewPowerOfTwo(cfg Config) *PowerOfTwo {
	c := cfg.withDefaults()
	return &PowerOfTwo{rand: c.Rand, loads: c.Loads}
}

// Name returns "power_of_two".
func (*PowerOfTwo) Name() string { return "power_of_two" }

// Pick samples two available workers and returns the one with the lower load (ties: the first
// sampled).
func (p *PowerOfTwo) Pick(_ context.Context, candidates []*worker.Worker, _ *Request) *worker.Worker {
	var buf [16]*worker.Worker
	av := available(buf[:0], candidates)
	switch len(av) {
	case 0:
		return nil
	case 1:
		return av[0]
	}
	i := p.rand(len(av))
	j := p.rand(len(av) - 1)
	if j >= i {
		j++
	}
	a, b := av[i], av[j]
	if p.loads.Load(b) < p.loads.Load(a) {
		return b
	}
	return a
}
