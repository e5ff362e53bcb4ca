package policy

import (
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/radix"
)

// prefixTree is the prefix tree a policy keeps (cache_aware, cache_aware_hash, precise_prefix's
// fallback): the tree, its share of the gateway-wide budget and, unless Config.NoBackground, the
// goroutine that trims it every EvictionInterval until Close. The zero value is not usable.
type prefixTree struct {
	tree      *radix.Tree
	maxSize   int
	budget    *TreeBudget // shared with the router's other policies; nil: none
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// newPrefixTree returns a tree built from c (defaults filled) and starts its eviction loop
// unless c.NoBackground.
func newPrefixTree(c Config) *prefixTree {
	t := &prefixTree{
		tree:    radix.New(radix.Options{Now: c.Now}),
		maxSize: c.CacheAware.MaxTreeSize,
		budget:  c.Budget,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	t.budget.add(t.tree)
	if c.NoBackground {
		close(t.done)
		return t
	}
	go t.evictLoop(c.CacheAware.EvictionInterval)
	return t
}

// evictLoop runs Evict every interval until Close.
func (t *prefixTree) evictLoop(interval time.Duration) {
	defer close(t.done)
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			t.Evict()
		}
	}
}

// Evict trims every worker's share of the tree to MaxTreeSize characters, or less when the
// gateway-wide TreeBudget is exceeded, least recently used first, now. The eviction loop calls
// it; the virtual-time fleet simulator calls it itself.
func (t *prefixTree) Evict() { t.tree.Evict(t.budget.shareCap(int64(t.maxSize))) }

// Close stops the eviction loop and waits for it to exit. It is idempotent and always returns
// nil; it exists so that owners can treat policies as io.Closer.
func (t *prefixTree) Close() error {
	t.closeOnce.Do(func() { close(t.stop); t.budget.remove(t.tree) })
	<-t.done
	return nil
}

// TreeSizes returns worker id → characters the tree records for it.
func (t *prefixTree) TreeSizes() map[string]int64 { return t.tree.Sizes() }

// HotPrefixes returns the tree's hot prefixes (radix.Tree.Hot).
func (t *prefixTree) HotPrefixes(opts radix.HotOptions) []radix.HotPrefix { return t.tree.Hot(opts) }

// RecordWarm records text for workerID, as if it had routed a request there.
func (t *prefixTree) RecordWarm(workerID, text string) { t.tree.Insert(text, workerID) }
