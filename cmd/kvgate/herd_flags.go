package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/policy"
)

// herdFlags registers the cost's herd term (policy.CostConfig.HerdShare, internal/policy/costherd.go),
// its shared-step term (policy.CostConfig.StepDelay, internal/policy/coststep.go) and its
// queued-sends term (policy.CostConfig.QueueSends, internal/policy/costqueue.go)
// for kvgate serve and kvgate bench --fleet alike. An operator's flag: it weighs a routing term
// only, and the config's validation bounds it to [0, 100].
func herdFlags(fs *flag.FlagSet, c *policy.CostConfig, prefix string) {
	fs.Float64Var(&c.HerdShare, "cost-herd-share", c.HerdShare, prefix+"cost: decode steps charged per request sent to a worker within its current step and not yet reported, in [0,100] (0 = off)")
	fs.Float64Var(&c.BlindWindow, "cost-blind-window", c.BlindWindow, prefix+"cost, with --replica-sync: seconds a peer's decision may take to arrive; this replica's own sends to a worker within it count once more per live peer, in [0,10] (0 = off)")
	fs.BoolVar(&c.StepDelay, "cost-step-delay", c.StepDelay, prefix+"cost: add the shared-step term K: the delay a prompt's prefill adds to the first tokens of the requests sent to a worker within its current decode step, once that step's prefill outlasts its decode")
	fs.BoolVar(&c.QueueSends, "cost-queue-sends", c.QueueSends, prefix+"cost: add the queued-sends term U: S is at least the prefill of this replica's sends since a worker's report that it cannot have done yet, its queue drained at the prefill rate only while it holds work")
	fs.Float64Var(&c.PrefillChunk, "cost-prefill-chunk", c.PrefillChunk, prefix+"cost: the most prompt tokens an engine prefills in one step beside its decode (vLLM max_num_batched_tokens, SGLang chunked_prefill_size), for --cost-step-delay, in [1,1e7]")
}
