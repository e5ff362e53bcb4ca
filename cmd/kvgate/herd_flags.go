package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/policy"
)

// herdFlags registers the cost's herd term (policy.CostConfig.HerdShare, internal/policy/costherd.go)
// for kvgate serve and kvgate bench --fleet alike. An operator's flag: it weighs a routing term
// only, and the config's validation bounds it to [0, 100].
func herdFlags(fs *flag.FlagSet, c *policy.CostConfig, prefix string) {
	fs.Float64Var(&c.HerdShare, "cost-herd-share", c.HerdShare, prefix+"cost: decode steps charged per request sent to a worker within its current step and not yet reported, in [0,100] (0 = off)")
	fs.Float64Var(&c.BlindWindow, "cost-blind-window", c.BlindWindow, prefix+"cost, with --replica-sync: seconds a peer's decision may take to arrive; this replica's own sends to a worker within it count once more per live peer, in [0,10] (0 = off)")
}
