package fleet

import (
	"context"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// OraclePolicy is the policy name under which the fleet simulator runs the Oracle. It exists
// only in the simulator: no gateway can read engines' caches and queues for free.
const OraclePolicy = "oracle"

// Truth is the exact, current state of the engines, as an oracle router reads it: what a router
// would know if every engine's KV-cache events and queue reached it instantly. Engines are
// numbered 0..n-1 in the fleet's order. The fleet simulator implements it.
type Truth interface {
	// CachedPrefix returns how many leading tokens of text engine i would find in its prefix
	// cache if the request were admitted now (engine.Engine.CachedPrefix).
	CachedPrefix(i int, text string) int
	// Load returns engine i's load report now.
	Load(i int) engine.Load
	// Config returns engine i's cost model and capacity.
	Config(i int) engine.Config
}

// Oracle routes with exact knowledge of every engine's cache and queue. For each engine it
// computes the request's time to its first token had it been sent there: the prefill work
// queued ahead of it (engine.Load.PrefillTokens) plus its own prompt less the engine's true
// longest cached prefix, over the engine's prefill rate; it sends the request where that time is
// least (ties: the longer cached prefix, then the shorter backlog, then fewer requests processed
// by this gateway). So a hit wins exactly as far as the prefill it saves outweighs the queue it
// joins: it is neither fooled by a shared opening (every engine holds it, so it saves nothing
// anywhere) nor blind to load. It is a reference point, not a product: its hit rate and goodput
// answer "how much would exact knowledge of engine caches (KV events) add over the prefix tree?"
// with a number. With no queue anywhere it takes the longest cached prefix, so on a fleet whose
// caches hold the working set it reaches the workload's ideal hit rate. Create it with
// NewOracle; the zero value is not usable. Not safe for concurrent use (the simulator is
// single-threaded).
type Oracle struct {
	truth  Truth
	engine func(*worker.Worker) (int, bool)
	hit    uint64
	miss   uint64
}

var (
	_ policy.Policy           = (*Oracle)(nil)
	_ policy.DecisionReporter = (*Oracle)(nil)
)

// NewOracle returns an oracle reading truth and mapping each candidate worker to its engine
// index with engineOf (false: not an engine the oracle can see; it is skipped).
func NewOracle(truth Truth, engineOf func(*worker.Worker) (int, bool)) *Oracle {
	return &Oracle{truth: truth, engine: engineOf}
}

// Name returns "oracle".
func (*Oracle) Name() string { return OraclePolicy }

// Decisions returns decisions by branch: cache_hit (the chosen engine held part of the prompt)
// and cache_miss.
func (o *Oracle) Decisions() map[string]uint64 {
	return map[string]uint64{policy.BranchCacheHit: o.hit, policy.BranchCacheMiss: o.miss}
}

// oracleCand is one engine's figures during a pick.
type oracleCand struct {
	w       *worker.Worker
	cached  int
	backlog int64
	ttft    float64 // seconds of prefill until this request's first token
}

func (a *oracleCand) better(b *oracleCand) bool {
	switch {
	case a.ttft != b.ttft:
		return a.ttft < b.ttft
	case a.cached != b.cached:
		return a.cached > b.cached
	case a.backlog != b.backlog:
		return a.backlog < b.backlog
	}
	return a.w.Processed() < b.w.Processed()
}

// Pick returns the available engine where req would get its first token soonest. The fleet
// hands the oracle the whole prompt as req.Text.
func (o *Oracle) Pick(_ context.Context, candidates []*worker.Worker, req *policy.Request) *worker.Worker {
	n := engine.TokenCount(req.Text)
	var best oracleCand
	for _, w := range candidates {
		i, ok := o.engine(w)
		if !ok || !w.Available() {
			continue
		}
		l := o.truth.Load(i)
		c := oracleCand{w: w, cached: o.truth.CachedPrefix(i, req.Text), backlog: l.PrefillTokens}
		c.ttft = float64(c.backlog+int64(n-c.cached)) / o.truth.Config(i).PrefillTPS
		if best.w == nil || c.better(&best) {
			best = c
		}
	}
	if best.w == nil {
		return nil
	}
	if best.cached > 0 {
		o.hit++
	} else {
		o.miss++
	}
	return best.w
}
