package main

import (
	"flag"
	"log/slog"
	"os"
	"runtime/debug"
)

// The Go runtime's soft memory limit, derived from the request-body budget.
//
// --body-memory-budget bounds the body buffers held at once, not the garbage that freed bodies
// leave: a body larger than the pooled classes has a buffer of its own, and the collector's
// default pacing (GOGC=100) lets the heap reach twice what was live at the last cycle before it
// collects. 8 concurrent 100 MB bodies under a 512 MiB budget peaked at 935 MB RSS that way. With
// a soft limit of budget plus headroom the collector runs as the heap nears it, so the freed
// bodies are reclaimed before new ones are allocated.

// DefaultMemoryHeadroomBytes is the default --memory-limit-headroom: what the gateway holds
// besides request bodies (prefix trees, connections' buffers, answers being relayed, the
// runtime itself) at the scale one replica with a few GiB of memory serves.
const DefaultMemoryHeadroomBytes = 64 << 20

// minMemoryLimitBytes is the lowest soft limit the gateway sets: below it a small budget would
// have the collector run all the time for memory the process needs anyway.
const minMemoryLimitBytes = 64 << 20

// memoryFlags registers --memory-limit-headroom.
func memoryFlags(fs *flag.FlagSet, headroom *int64) {
	fs.Int64Var(headroom, "memory-limit-headroom", DefaultMemoryHeadroomBytes, "bytes added to --body-memory-budget to make the Go runtime's soft memory limit when GOMEMLIMIT is not set (negative = set no limit); see docs/security.md")
}

// memoryLimit is the soft limit for a body budget and headroom, or -1 for none: no limit when
// either is negative (no bound asked for), GOMEMLIMIT set (the operator's choice wins), or the
// sum overflows.
func memoryLimit(budget, headroom int64, env string) int64 {
	if env != "" || budget < 0 || headroom < 0 || budget > (1<<62)-headroom {
		return -1
	}
	return max(budget+headroom, minMemoryLimitBytes)
}

// setMemoryLimit sets the runtime's soft memory limit from the body budget, unless GOMEMLIMIT
// is set or no bound is asked for, and logs what it set.
func setMemoryLimit(budget, headroom int64, log *slog.Logger) {
	limit := memoryLimit(budget, headroom, os.Getenv("GOMEMLIMIT"))
	if limit < 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Info("Go soft memory limit set from the body budget", "limit_bytes", limit, "body_budget_bytes", budget, "headroom_bytes", headroom)
}
