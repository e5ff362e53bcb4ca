package bench

import "github.com/kvgate/kvgate/internal/engine"

// Ideal computes a workload's ideal prefix-cache hit rate: what one engine with an infinite
// cache would hit if it were sent every request, in the order given. No router can do better on
// a fleet of engines, whose caches are finite and split. It keys prompts exactly as the engine
// model does (full blocks of BlockSize tokens, chained over the prefix; at most the prompt minus
// one token counts as cached, since the last token is always computed), so its figure is
// comparable with a measured hit rate token for token. Not safe for concurrent use; the zero
// value is not usable (use NewIdeal).
type Ideal struct {
	bs     int
	seen   map[uint64]struct{}
	keys   []uint64
	prompt int64
	cached int64
}

// NewIdeal returns an empty Ideal for engines with blocks of blockSize tokens (zero means the
// engine default).
func NewIdeal(blockSize int) *Ideal {
	if blockSize <= 0 {
		blockSize = engine.DefaultConfig().BlockSize
	}
	return &Ideal{bs: blockSize, seen: map[uint64]struct{}{}}
}

// Add sends text to the ideal engine. When measured, its prompt and cached tokens count in
// HitRate; requests of a warm-up are added unmeasured, so that they warm the cache only.
func (d *Ideal) Add(text string, measured bool) {
	n := engine.TokenCount(text)
	if n == 0 {
		return
	}
	d.keys = engine.BlockKeys(d.keys[:0], text, d.bs)
	m := 0
	for m < len(d.keys) {
		if _, ok := d.seen[d.keys[m]]; !ok {
			break
		}
		m++
	}
	for _, k := range d.keys[m:] {
		d.seen[k] = struct{}{}
	}
	if measured {
		d.prompt += int64(n)
		d.cached += int64(min(m*d.bs, n-1))
	}
}

// HitRate returns cached ÷ prompt tokens over the measured requests, rounded as Summary rounds
// hit rates; 0 before any.
func (d *Ideal) HitRate() float64 {
	if d.prompt == 0 {
		return 0
	}
	return round(float64(d.cached)/float64(d.prompt), 4)
}
