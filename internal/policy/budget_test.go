package policy

import (
	"fmt"
	"strings"
	"testing"
)

// TestTreeBudgetBoundsEveryTree: policies of several models sharing one budget hold no more than
// it after their eviction passes, though each worker's share is far under MaxTreeSize; without
// the budget nothing is evicted.
func TestTreeBudgetBoundsEveryTree(t *testing.T) {
	for _, budget := range []int64{0, 4000} {
		cfg := DefaultConfig()
		cfg.NoBackground = true
		cfg.Budget = NewTreeBudget(budget)
		var ps []*CacheAware
		for m := range 3 {
			p := NewCacheAware(cfg)
			defer p.Close()
			for w := range 4 {
				for i := range 10 {
					p.tree.Insert(fmt.Sprintf("model %d worker %d prompt %d %s", m, w, i, strings.Repeat("x", 100)), fmt.Sprintf("w%d", w))
				}
			}
			ps = append(ps, p)
		}
		held := func() (n int64) {
			for _, p := range ps {
				for _, s := range p.TreeSizes() {
					n += s
				}
			}
			return n
		}
		before := held()
		for _, p := range ps {
			p.Evict()
		}
		switch after := held(); {
		case budget == 0 && after != before:
			t.Errorf("no budget: %d characters became %d", before, after)
		case budget > 0 && after > budget:
			t.Errorf("budget %d: the trees hold %d characters (from %d)", budget, after, before)
		case budget > 0 && cfg.Budget.Held() != after:
			t.Errorf("budget reports %d held, the trees %d", cfg.Budget.Held(), after)
		}
	}
}
