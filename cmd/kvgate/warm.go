package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/policy"
)

// addWarmFlags registers the flags that warm a worker joining a pool (internal/gateway/warm.go).
// Only the operator sets them; a worker cannot: the warm-up sends a joining worker prefixes
// other clients already sent to the pool, bounded per join by every one of these.
func addWarmFlags(fs *flag.FlagSet, c *policy.WarmConfig) {
	d := policy.DefaultWarmConfig()
	fs.IntVar(&c.Prefixes, "warm-prefixes", 0, "warm each worker that joins a pool with up to this many of the pool's hot prefixes (one-token completions of prompt text) before it takes hits (0 = off; at most 4096)")
	fs.IntVar(&c.MaxTokens, "warm-max-tokens", d.MaxTokens, "prompt tokens one warm-up may send, counted at 4 bytes a token")
	fs.IntVar(&c.Concurrency, "warm-concurrency", d.Concurrency, "warm requests in flight to a joining worker at once")
	fs.DurationVar(&c.Timeout, "warm-timeout", d.Timeout, "bound on one warm-up; what has not succeeded by then is not recorded")
}
