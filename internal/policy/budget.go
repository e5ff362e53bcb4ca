package policy

import (
	"sync"

	"github.com/kvgate/kvgate/internal/radix"
)

// TreeBudget is a gateway-wide bound on the characters held by the prefix trees of every policy
// that shares it (every model and pool of one Router). MaxTreeSize bounds one worker's share of
// one tree; with many models and workers that product grows without bound (an hour on 64
// engines held about 4 GB), so the budget is split evenly over the (tree, worker) shares that
// hold text, and each eviction pass trims every share to the smaller of the two caps, with the
// same least-recently-used order. A nil *TreeBudget bounds nothing beyond MaxTreeSize.
type TreeBudget struct {
	max int64

	mu    sync.Mutex
	trees map[*radix.Tree]struct{}
}

// NewTreeBudget returns a budget of maxChars characters in all; maxChars <= 0 returns nil (no
// gateway-wide bound).
func NewTreeBudget(maxChars int64) *TreeBudget {
	if maxChars <= 0 {
		return nil
	}
	return &TreeBudget{max: maxChars, trees: map[*radix.Tree]struct{}{}}
}

func (b *TreeBudget) add(t *radix.Tree) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.trees[t] = struct{}{}
	b.mu.Unlock()
}

func (b *TreeBudget) remove(t *radix.Tree) {
	if b == nil {
		return
	}
	b.mu.Lock()
	delete(b.trees, t)
	b.mu.Unlock()
}

// Max returns the budget in characters (0 for a nil budget: no bound).
func (b *TreeBudget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}

// Held returns the characters the budget's trees hold now, summed over workers and trees.
func (b *TreeBudget) Held() int64 {
	held, _ := b.usage()
	return held
}

// usage returns the characters held and the number of (tree, worker) shares that hold any.
func (b *TreeBudget) usage() (held int64, shares int64) {
	if b == nil {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for t := range b.trees {
		for _, n := range t.Sizes() {
			if n > 0 {
				held += n
				shares++
			}
		}
	}
	return held, shares
}

// shareCap is the cap on one worker's share of one tree: perWorker, lowered to an even split of
// the budget once the trees hold more than it.
func (b *TreeBudget) shareCap(perWorker int64) int64 {
	held, shares := b.usage()
	if b == nil || held <= b.max || shares == 0 {
		return perWorker
	}
	return min(perWorker, max(b.max/shares, 1))
}
