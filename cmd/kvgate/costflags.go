package main

import (
	"flag"

	"github.com/kvgate/kvgate/internal/policy"
)

// costFlags registers the cost model's constants (policy.CostConfig) on fs, for kvgate serve and
// for kvgate bench --fleet alike; prefix starts each help text ("" or "fleet policy: ").
func costFlags(fs *flag.FlagSet, c *policy.CostConfig, prefix string) {
	fs.Float64Var(&c.PrefillRate, "prefill-rate", c.PrefillRate, prefix+"cost: prefill tokens per second a worker is taken to run at until its reports measure it")
	fs.Float64Var(&c.BytesPerToken, "bytes-per-token", c.BytesPerToken, prefix+"cost: prompt bytes per token where the prompt is not tokenized")
	fs.Float64Var(&c.TieSeconds, "cost-tie-seconds", c.TieSeconds, prefix+"cost: candidates within this many seconds (plus --cost-tie-share of the least cost) of the least are ordered by the prompt's rendezvous hash")
	fs.Float64Var(&c.TieShare, "cost-tie-share", c.TieShare, prefix+"cost: the relative part of the tie window, a share of the least cost")
	fs.Float64Var(&c.FollowShare, "cost-follow-share", c.FollowShare, prefix+"cost: share of a prompt past the routing text taken as cached where all of the routing text is, in [0,1]")
	fs.Float64Var(&c.DelayShare, "cost-delay-share", c.DelayShare, prefix+"cost: weight of the requests queued behind a prompt's prefill, each of which it delays, in [0,10] (0: each request's own wait only)")
	fs.Float64Var(&c.MaxTokenUsage, "cost-max-token-usage", c.MaxTokenUsage, prefix+"cost: a worker reporting KV usage above this is no candidate while another is under it (1 = off)")
	learnFlags(fs, c, prefix)
	fs.Int64Var(&c.MaxWaiting, "cost-max-waiting", c.MaxWaiting, prefix+"cost: a worker reporting more waiting requests than this is no candidate while another is under it (0 = off)")
	// The engine estimate's constants (loadmon.Estimate), which flow control reads too.
	fs.Float64Var(&c.RateDecay, "cost-rate-decay", c.RateDecay, prefix+"cost: how much a worker's measured prefill rate decays per measured poll interval, in [0,1]")
	fs.IntVar(&c.RateSamples, "cost-rate-samples", c.RateSamples, prefix+"cost: busy poll intervals that must measure a worker's prefill rate before it replaces --prefill-rate, in [0,1000]")
	fs.Float64Var(&c.RateCap, "cost-rate-cap", c.RateCap, prefix+"cost: one interval's measured prefill rate is at most this many times --prefill-rate, in [1,1e6]")
	fs.Float64Var(&c.MinDecodeRate, "cost-min-decode-rate", c.MinDecodeRate, prefix+"cost: floor of the fleet's generation throughput in the decode term, tokens/s per running request")
	fs.Float64Var(&c.MeanWindow, "cost-mean-window", c.MeanWindow, prefix+"cost: sent prompts over which the mean uncached prompt (the unit of the queued-behind term) moves, in [1,1e6]")
	loraCostFlags(fs, &c.LoRA, prefix)
	herdFlags(fs, c, prefix)
}
