package lru

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// modelEntry is one entry of the model: a slice kept in recency order, most recent first.
type modelEntry struct {
	k, v, cost int
	deadline   time.Time
}

type model struct {
	es               []modelEntry
	expired, evicted uint64
}

func (m *model) find(k int) int {
	return slices.IndexFunc(m.es, func(e modelEntry) bool { return e.k == k })
}

func (m *model) toFront(i int) {
	e := m.es[i]
	m.es = append([]modelEntry{e}, slices.Delete(m.es, i, i+1)...)
}

func (m *model) cost() int {
	n := 0
	for _, e := range m.es {
		n += e.cost
	}
	return n
}

func (e modelEntry) expiredAt(now time.Time) bool {
	return !e.deadline.IsZero() && now.After(e.deadline)
}

// TestCacheAgainstModel drives random gets (plain and live), peeks, adds (with and without a
// deadline), removes and expiries, on a clock that moves forward and sometimes back, against a
// slice kept in recency order; it checks contents, order, costs, the bound and the drop counts
// after every step.
func TestCacheAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const bound = 50
	c := New[int, int](bound)
	var m model
	now := time.Unix(1000, 0)
	for step := range 40000 {
		k := rng.IntN(30)
		switch r := rng.IntN(20); {
		case r < 1:
			now = now.Add(time.Duration(rng.IntN(7)-1) * time.Second) // back a second now and then
		case r < 5:
			v, ok := c.Get(k)
			i := m.find(k)
			if ok != (i >= 0) || ok && v != m.es[i].v {
				t.Fatalf("step %d: get %d = %d %v, model index %d", step, k, v, ok, i)
			}
			if i >= 0 {
				m.toFront(i)
			}
		case r < 8:
			v, ok := c.GetLive(k, now)
			i := m.find(k)
			live := i >= 0 && !m.es[i].expiredAt(now)
			if ok != live || ok && v != m.es[i].v {
				t.Fatalf("step %d: get live %d = %d %v, model index %d live %v", step, k, v, ok, i, live)
			}
			switch {
			case live:
				m.toFront(i)
			case i >= 0:
				m.es = slices.Delete(m.es, i, i+1)
				m.expired++
			}
		case r < 9:
			v, dl, ok := c.Peek(k)
			i := m.find(k)
			if ok != (i >= 0) || ok && (v != m.es[i].v || !dl.Equal(m.es[i].deadline)) {
				t.Fatalf("step %d: peek %d = %d %v %v, model index %d", step, k, v, dl, ok, i)
			}
		case r < 16:
			cost := rng.IntN(12)
			var dl time.Time
			if rng.IntN(3) > 0 {
				dl = now.Add(time.Duration(rng.IntN(10)) * time.Second)
			}
			if i := m.find(k); i >= 0 {
				m.es = slices.Delete(m.es, i, i+1)
			}
			m.es = append([]modelEntry{{k, step, cost, dl}}, m.es...)
			want := 0
			for m.cost() > bound && len(m.es) > 0 {
				m.es = m.es[:len(m.es)-1]
				want++
			}
			m.evicted += uint64(want)
			var got int
			if dl.IsZero() && rng.IntN(2) == 0 {
				got = c.Add(k, step, cost)
			} else {
				got = c.AddUntil(k, step, cost, dl)
			}
			if got != want {
				t.Fatalf("step %d: add dropped %d, model %d", step, got, want)
			}
		case r < 18:
			i := m.find(k)
			if got := c.Remove(k); got != (i >= 0) {
				t.Fatalf("step %d: remove %d = %v", step, k, got)
			}
			if i >= 0 {
				m.es = slices.Delete(m.es, i, i+1)
			}
		default:
			limit := rng.IntN(5) - 1
			want := 0
			for len(m.es) > 0 && want != limit && m.es[len(m.es)-1].expiredAt(now) {
				m.es = m.es[:len(m.es)-1]
				want++
			}
			m.expired += uint64(want)
			if got := c.Expire(now, limit); got != want {
				t.Fatalf("step %d: expire(%d) dropped %d, model %d", step, limit, got, want)
			}
		}
		if c.Len() != len(m.es) || c.Cost() != m.cost() || c.Cost() > bound {
			t.Fatalf("step %d: len %d/%d cost %d/%d", step, c.Len(), len(m.es), c.Cost(), m.cost())
		}
		if k, _, ok := c.Oldest(); ok != (len(m.es) > 0) || ok && k != m.es[len(m.es)-1].k {
			t.Fatalf("step %d: oldest %d %v", step, k, ok)
		}
		if ex, ev := c.Drops(); ex != m.expired || ev != m.evicted {
			t.Fatalf("step %d: drops %d expired %d evicted, model %d %d", step, ex, ev, m.expired, m.evicted)
		}
	}
	if ex, ev := c.Drops(); ex == 0 || ev == 0 {
		t.Fatalf("the walk never expired (%d) or evicted (%d) an entry", ex, ev)
	}
}

// TestCacheOrderAgainstModel walks the whole recency order (by dropping the oldest until empty)
// after a random history, against the model: Oldest alone checks only one end.
func TestCacheOrderAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 200 {
		c := New[int, int](1 << 30)
		var m model
		for step := range 60 {
			k := rng.IntN(12)
			if rng.IntN(3) == 0 {
				c.Get(k)
				if i := m.find(k); i >= 0 {
					m.toFront(i)
				}
				continue
			}
			c.Add(k, step, 1)
			if i := m.find(k); i >= 0 {
				m.es = slices.Delete(m.es, i, i+1)
			}
			m.es = append([]modelEntry{{k: k, v: step, cost: 1}}, m.es...)
		}
		for i := len(m.es) - 1; i >= 0; i-- {
			k, v, ok := c.Oldest()
			if !ok || k != m.es[i].k || v != m.es[i].v {
				t.Fatalf("round %d: oldest %d=%d %v, model %d=%d", round, k, v, ok, m.es[i].k, m.es[i].v)
			}
			c.Remove(k)
		}
		if c.Len() != 0 {
			t.Fatalf("round %d: %d entries left", round, c.Len())
		}
	}
}
