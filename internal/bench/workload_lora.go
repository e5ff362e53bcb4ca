package bench

import (
	"fmt"
	"math/rand/v2"
)

// Adapter traffic: a fleet that serves many LoRA adapters of one base model sees each session
// name one adapter as its model, a few adapters popular and most rare. WithAdapters gives the
// sessions of any workload such models.

// MaxAdapters bounds WithAdapters' adapter count.
const MaxAdapters = 4096

// Adapters is a workload whose sessions each name one of N LoRA adapters, drawn with Zipf
// popularity (the adapter of rank k, from 0, is chosen with weight 1 ÷ (1 + k)^S).
type Adapters struct {
	// Inner is the workload whose sessions are given adapters.
	Inner Workload
	// N is the number of adapters, named AdapterName(0) … AdapterName(N−1).
	N int
	// S is the Zipf exponent, > 1 (math/rand/v2's Zipf).
	S    float64
	seed uint64
}

// AdapterName is the model id of adapter k of an adapter workload.
func AdapterName(k int) string { return fmt.Sprintf("lora-%02d", k) }

// WithAdapters returns w with each session naming one of n adapters (Zipf exponent s > 1) as
// every turn's model; n = 0 returns w unchanged.
func WithAdapters(w Workload, n int, s float64, seed uint64) (Workload, error) {
	switch {
	case n == 0:
		return w, nil
	case n < 0 || n > MaxAdapters:
		return nil, fmt.Errorf("adapters %d must be in [0, %d]", n, MaxAdapters)
	case !(s > 1) || s > 100:
		return nil, fmt.Errorf("adapter Zipf exponent %v must be in (1, 100]", s)
	}
	a := &Adapters{Inner: w, N: n, S: s, seed: seed}
	if r, ok := w.(Replay); ok {
		return &replayAdapters{a, r}, nil
	}
	return a, nil
}

// replayAdapters is Adapters over a trace: still a Replay, so that it keeps its arrival times.
type replayAdapters struct {
	*Adapters
	r Replay
}

// Len returns the trace's number of sessions.
func (r *replayAdapters) Len() int { return r.r.Len() }

// Name returns the inner workload's name with the adapters.
func (a *Adapters) Name() string { return fmt.Sprintf("%s+%dlora", a.Inner.Name(), a.N) }

// Session returns the inner workload's session k, every turn naming the session's adapter.
func (a *Adapters) Session(k int) (Session, bool) {
	s, ok := a.Inner.Session(k)
	if !ok {
		return s, false
	}
	model := AdapterName(a.adapter(k))
	turns := make([]Turn, len(s.Turns))
	copy(turns, s.Turns)
	for i := range turns {
		turns[i].Model = model
	}
	s.Turns = turns
	return s, true
}

// adapter is session k's adapter index, a pure function of the seed and k.
func (a *Adapters) adapter(k int) int {
	r := rngFor(a.seed, 0x10da, k)
	return int(rand.NewZipf(r, a.S, 1, uint64(a.N-1)).Uint64())
}
