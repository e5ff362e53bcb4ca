package lru

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCacheAgainstModel drives random gets, adds and removes against a slice kept in recency
// order, and checks contents, order, costs and the bound after every step.
func TestCacheAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const bound = 50
	c := New[int, int](bound)
	type kv struct{ k, v, cost int }
	var model []kv // most recent first
	find := func(k int) int { return slices.IndexFunc(model, func(e kv) bool { return e.k == k }) }
	for step := range 20000 {
		k := rng.IntN(30)
		switch r := rng.IntN(10); {
		case r < 4:
			v, ok := c.Get(k)
			i := find(k)
			if ok != (i >= 0) || ok && v != model[i].v {
				t.Fatalf("step %d: get %d = %d %v, model index %d", step, k, v, ok, i)
			}
			if i >= 0 {
				e := model[i]
				model = append([]kv{e}, slices.Delete(model, i, i+1)...)
			}
		case r < 8:
			cost := rng.IntN(12)
			if i := find(k); i >= 0 {
				model = slices.Delete(model, i, i+1)
			}
			model = append([]kv{{k, step, cost}}, model...)
			want := 0
			for total := sumCost(model); total > bound && len(model) > 0; total = sumCost(model) {
				model = model[:len(model)-1]
				want++
			}
			if got := c.Add(k, step, cost); got != want {
				t.Fatalf("step %d: add dropped %d, model %d", step, got, want)
			}
		default:
			i := find(k)
			if got := c.Remove(k); got != (i >= 0) {
				t.Fatalf("step %d: remove %d = %v", step, k, got)
			}
			if i >= 0 {
				model = slices.Delete(model, i, i+1)
			}
		}
		if c.Len() != len(model) || c.Cost() != sumCost(model) || c.Cost() > bound {
			t.Fatalf("step %d: len %d/%d cost %d/%d", step, c.Len(), len(model), c.Cost(), sumCost(model))
		}
		if k, _, ok := c.Oldest(); ok != (len(model) > 0) || ok && k != model[len(model)-1].k {
			t.Fatalf("step %d: oldest %d %v", step, k, ok)
		}
	}
}

func sumCost[T interface{ ~struct{ k, v, cost int } }](m []T) int {
	n := 0
	for _, e := range m {
		n += struct{ k, v, cost int }(e).cost
	}
	return n
}
