package policy

import (
	"cmp"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/radix"
)

// Warming a worker that joins a pool: the gateway (internal/gateway/warm.go) and the fleet
// simulator (internal/fleet/warm.go) both ask PlanWarm which prefixes to send the new worker,
// send each as a one-token request, and call Warmed for those that succeeded. Without it a new
// worker holds nothing, so the hit path never sends it a hit: where a fixed set of prefixes is
// cached elsewhere (tenant contexts, system prompts) it takes no load, and making live requests
// spill to it costs each a full prefill (docs/routing.md §14.1). A warmed worker is a holder of
// the hot prefixes, and the hit path spreads their traffic over it like over any other holder.

// WarmConfig bounds the warm-up of a worker that joins a pool. The zero value turns warming off.
type WarmConfig struct {
	// Prefixes is the most prefixes sent to a joining worker; 0 turns warming off. Default off;
	// the serve flag --warm-prefixes documents the measured choice.
	Prefixes int `yaml:"warm_prefixes"`
	// MaxTokens bounds the prompt tokens of one warm-up, counted at 4 bytes a token (the
	// engines' own count is in the warm-up's log line and metrics). Default 262144.
	MaxTokens int `yaml:"warm_max_tokens"`
	// Concurrency is the most warm requests in flight to the joining worker at once. Default 4.
	Concurrency int `yaml:"warm_concurrency"`
	// Timeout bounds one warm-up, every request of it; what has not succeeded by then is not
	// recorded. Default 60s.
	Timeout time.Duration `yaml:"warm_timeout"`
}

// Bounds a configuration may not exceed: a hostile or mistyped value must not make one join
// cost more than a bounded amount of the new worker's time or of the gateway's memory.
const (
	maxWarmPrefixes    = 4096
	maxWarmTokens      = 1 << 24
	maxWarmConcurrency = 64
	maxWarmTimeout     = time.Hour
)

// warmHorizon is how recently a prefix must have been sent to count as hot: older ones are
// what the tree's LRU is about to drop, and the engines too.
const warmHorizon = 10 * time.Minute

// minWarmChars is the shortest prefix worth a warm request: shorter ones save less prefill than
// the request costs, and a shared opening that short makes nobody a holder.
const minWarmChars = 256

// WarmBytesPerToken is the token estimate of warming's budget (and of the engines' tokenizer
// in internal/engine): about 4 bytes of text per token.
const WarmBytesPerToken = 4

// DefaultWarmConfig returns the bounds used when warming is on and a bound is not given:
// 262144 tokens, 4 requests at once, 60 s. Prefixes stays 0 (off).
func DefaultWarmConfig() WarmConfig {
	return WarmConfig{MaxTokens: 1 << 18, Concurrency: 4, Timeout: time.Minute}
}

// WithDefaults returns c with every zero bound replaced by its default.
func (c WarmConfig) WithDefaults() WarmConfig {
	d := DefaultWarmConfig()
	c.MaxTokens = cmp.Or(c.MaxTokens, d.MaxTokens)
	c.Concurrency = cmp.Or(c.Concurrency, d.Concurrency)
	c.Timeout = cmp.Or(c.Timeout, d.Timeout)
	return c
}

// Enabled reports whether warming is on.
func (c WarmConfig) Enabled() bool { return c.Prefixes > 0 }

// Validate reports a bound out of range.
func (c WarmConfig) Validate() error {
	switch {
	case c.Prefixes < 0 || c.Prefixes > maxWarmPrefixes:
		return errors.New("warm_prefixes must be in [0, 4096]")
	case c.MaxTokens < 0 || c.MaxTokens > maxWarmTokens:
		return errors.New("warm_max_tokens must be in [0, 16777216]")
	case c.Concurrency < 0 || c.Concurrency > maxWarmConcurrency:
		return errors.New("warm_concurrency must be in [0, 64]")
	case c.Timeout < 0 || c.Timeout > maxWarmTimeout:
		return errors.New("warm_timeout must be in [0, 1h]")
	}
	return nil
}

// Warmer is implemented by policies that keep a prefix tree (cache_aware, cache_aware_hash, and
// sticky sessions around them).
type Warmer interface {
	// HotPrefixes returns the tree's hot prefixes as radix.Tree.Hot does.
	HotPrefixes(opts radix.HotOptions) []radix.HotPrefix
	// RecordWarm records that workerID now holds text: a warm request for it succeeded.
	RecordWarm(workerID, text string)
}

var (
	_ Warmer = (*CacheAware)(nil)
	_ Warmer = (*Sticky)(nil)
)

// HotPrefixes returns the tree's hot prefixes (radix.Tree.Hot).
func (p *CacheAware) HotPrefixes(opts radix.HotOptions) []radix.HotPrefix { return p.tree.Hot(opts) }

// RecordWarm records text for workerID, as if it had routed a request there.
func (p *CacheAware) RecordWarm(workerID, text string) { p.tree.Insert(text, workerID) }

// HotPrefixes asks the wrapped policy; nil when it keeps no tree.
func (p *Sticky) HotPrefixes(opts radix.HotOptions) []radix.HotPrefix {
	if w, ok := p.inner.(Warmer); ok {
		return w.HotPrefixes(opts)
	}
	return nil
}

// RecordWarm tells the wrapped policy, if it keeps a tree.
func (p *Sticky) RecordWarm(workerID, text string) {
	if w, ok := p.inner.(Warmer); ok {
		w.RecordWarm(workerID, text)
	}
}

// PlanWarm returns the prompts to send workerID, which just joined the pool p routes, at now:
// up to cfg.Prefixes of the pool's hot prefixes that other workers hold and workerID does not
// (radix.Tree.Hot: the most characters × hits first, touched within the last 10 minutes, at least
// 256 characters), hottest first, within cfg.MaxTokens. A prefix that would overrun the budget is
// skipped for the next, smaller ones. Nil when warming is off or p keeps no tree.
//
// routedBytes is how much of a prompt the tree sees (the routing prefix). A prefix that reaches
// it is a cut: the prompts through it go on past what the tree knows, so a warm request could
// copy only its first part, and the warmed worker would then take hits that it answers with the
// rest of a long prefill (measured on 6k-token tenant contexts: TTFT p99 863 ms in the window
// after the join, against 14 ms unwarmed, docs/routing.md §14.2). Such prefixes are skipped.
func PlanWarm(p Policy, workerID string, cfg WarmConfig, now time.Time, routedBytes int) []string {
	w, ok := p.(Warmer)
	if !ok || !cfg.Enabled() {
		return nil
	}
	cfg = cfg.WithDefaults()
	opts := radix.HotOptions{Limit: cfg.Prefixes, Exclude: workerID, MinChars: minWarmChars, Since: now.Add(-warmHorizon)}
	if routedBytes > 0 {
		// The routing text is cut at a rune start at most 3 bytes before the limit.
		opts.MaxBytes = max(routedBytes-utf8.UTFMax, 1)
	}
	var out []string
	budget := cfg.MaxTokens
	for _, h := range w.HotPrefixes(opts) {
		if strings.HasPrefix(h.Text, saltMark) {
			continue // a salted prefix: the gateway keeps no salt to send it with (salt.go)
		}
		if n := WarmTokens(h.Text); n <= budget {
			out = append(out, h.Text)
			budget -= n
		}
	}
	return out
}

// WarmTokens is a prompt's tokens by warming's estimate.
func WarmTokens(text string) int { return (len(text) + WarmBytesPerToken - 1) / WarmBytesPerToken }

// Warmed records that workerID holds text in p's tree, after a warm request for it succeeded.
func Warmed(p Policy, workerID, text string) {
	if w, ok := p.(Warmer); ok {
		w.RecordWarm(workerID, text)
	}
}
