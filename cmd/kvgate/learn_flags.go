package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/policy"
)

// learnFlags registers what the cost learns from the answers (policy/learn.go) on fs.
// Operators only: a flag, never a request field, so no client can change it.
func learnFlags(fs *flag.FlagSet, c *policy.CostConfig, prefix string) {
	fs.BoolVar(&c.FollowRouteLearned, "cost-follow-route-learned", c.FollowRouteLearned, prefix+"cost: price the share past the routing text with the share learned from the answers, not --cost-follow-share (which the prediction always learns from)")
	fs.BoolVar(&c.FollowFixed, "cost-follow-fixed", c.FollowFixed, prefix+"cost: keep the share past the routing text at --cost-follow-share instead of learning it from what the answers report cached")
	fs.BoolVar(&c.RateFromCounters, "cost-rate-from-counters", c.RateFromCounters, prefix+"cost: price each prompt's own miss at the prefill rate the engines' counters give (vLLM's request_prefill_time_seconds: μp, a prompt's own rate), the queue ahead and behind at μ, the rate the engine drains it at")
}
