package fleet

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/worker"
)

// simModel is the model id every simulated engine serves.
const simModel = "sim-model"

// gateway is one simulated gateway replica: its own worker objects for every engine, its own
// policy, and its own view of the load reports, which it refreshes by polling.
type gateway struct {
	s       *sim
	idx     int
	workers []*worker.Worker
	index   map[*worker.Worker]int
	pol     policy.Policy
	evictor policy.Evicter
	rng     *rand.Rand

	reports []loadmon.Report
	polled  []bool
	// counters are each engine's prefill counters at the last poll (Config.PrefillCounters).
	counters []loadmon.PrefillCounters
	phase    time.Duration
	req      policy.Request
	// fullText: the policy sees the whole prompt, not the gateway's routing prefix (the oracle).
	fullText bool
	// cands are the workers the policy chooses among once a worker change happened (the
	// registry's view: a removed worker is no candidate); nil means workers.
	cands []*worker.Worker
	// kv is this replica's KV-cache event index and tokenizer, for precise_prefix.
	kv *replicaKV
	// narrow, when not empty, are the candidates of the next pick: a request flow control
	// dispatched picks among the engines that can start it (flow.go).
	narrow []*worker.Worker
	// node is this replica's end of the replica sync plane (sync.go); nil when it is off.
	node *replicasync.Node
	// pc is the configuration policies are built from (nil for the oracle), pols the adapters'
	// own policies (lora.go).
	pc   *policy.Config
	pols map[string]policy.Policy
}

var _ policy.Loads = (*gateway)(nil)

// newGateway builds replica g of s.
func newGateway(s *sim, g int) (*gateway, error) {
	gw := &gateway{
		s:       s,
		idx:     g,
		index:   make(map[*worker.Worker]int, len(s.engines)),
		rng:     rand.New(rand.NewPCG(s.cfg.Seed, uint64(g)+1)),
		reports: make([]loadmon.Report, len(s.engines)),
		polled:  make([]bool, len(s.engines)),
	}
	if s.cfg.PrefillCounters {
		gw.counters = make([]loadmon.PrefillCounters, len(s.engines))
	}
	for i := range s.engines {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://engine-%d:8000", i), Models: []string{simModel}}, worker.BreakerConfig{Disabled: true})
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		w.SetHealth(worker.Ready)
		gw.workers = append(gw.workers, w)
		gw.index[w] = i
	}
	pc := s.cfg.PolicyConfig
	pc.Loads = gw
	pc.Rand = func(n int) int { return gw.rng.IntN(n) }
	pc.Now = func() time.Time { return epoch.Add(s.now) }
	pc.NoBackground = true
	if name, _ := canonical(s.cfg.Policy); name == OraclePolicy {
		gw.pol = NewOracle(s, gw.engineOf)
		gw.fullText = true
	} else {
		if s.kv != nil {
			gw.kv = newReplicaKV(gw, s.kv)
			pc.KV = gw.kv
		}
		if s.bus != nil {
			node, err := s.newSyncNode()
			if err != nil {
				return nil, fmt.Errorf("fleet: %w", err)
			}
			gw.node, pc.Peers = node, node
		}
		pol, err := policy.New(s.cfg.Policy, pc)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		gw.pol = pol
		gw.pc = &pc
	}
	pol := gw.pol
	gw.evictor, _ = pol.(policy.Evicter)
	// Replicas start at different moments, so their polls are not aligned.
	gw.phase = time.Duration(gw.rng.Int64N(int64(s.cfg.PollInterval)))
	return gw, nil
}

// close stops whatever the policy runs.
func (g *gateway) close() {
	if c, ok := g.pol.(io.Closer); ok {
		c.Close()
	}
	g.closeAdapters()
}

// schedule queues the first poll and the first tree eviction.
func (g *gateway) schedule() {
	g.s.push(event{at: g.phase, kind: evPoll, idx: g.idx})
	if g.evictor != nil {
		g.s.push(event{at: g.phase + g.s.cfg.PolicyConfig.CacheAware.EvictionInterval, kind: evEvict, idx: g.idx})
	}
}

// pick asks the policy of adapter ("" the base model) for a worker for text and returns it with
// its engine index.
func (g *gateway) pick(text, key, adapter string) (*worker.Worker, int) {
	if g.kv != nil {
		// precise_prefix tokenizes the whole prompt, as it does a chat request's messages.
		g.kv.prompt = text
	}
	promptBytes := len(text)
	pol := g.policyFor(adapter)
	switch past := g.s.cfg.RoutingPrefixBytes; {
	case g.fullText || len(text) <= past:
	case g.s.cfg.FixedRoutingText:
		text = text[:past]
	default:
		text = policy.RoutingText(pol, text, false, past)
	}
	model, parent := simModel, ""
	if adapter != "" {
		model, parent = adapter, simModel
	}
	g.req = policy.Request{Model: model, Text: text, Key: key, Chat: g.kv != nil, PromptBytes: promptBytes, Adapter: adapter, Parent: parent}
	cands := g.candidates()
	if len(g.narrow) > 0 {
		cands = g.narrow
	}
	policy.Prepare(context.Background(), pol, cands, &g.req) // the tokenization a replica pays (kvevents.go)
	w := policy.Choose(context.Background(), pol, cands, &g.req)
	if w == nil {
		return nil, -1
	}
	return w, g.index[w]
}

// poll reads every engine's load now, as the load monitor does at each interval, recording this
// gateway's in-flight count at the moment of the poll, and queues the next poll.
func (g *gateway) poll() {
	s := g.s
	polledAt := epoch.Add(s.now)
	for i, se := range s.engines {
		s.syncEngine(i)
		l := se.e.Load()
		g.reports[i] = loadmon.ReportOf(rankOf(l))
		g.reports[i].PolledAt, g.reports[i].InflightAtPoll = polledAt, g.workers[i].Inflight()
		if g.counters != nil {
			g.reports[i].SetPrefillCounters(l.PrefilledTokens, 0, l.PrefillSeconds)
			g.counters[i].Derive(&g.reports[i], s.cfg.StaleAfter)
		}
		g.reports[i].LoRA = s.loraReport(i)
		g.polled[i] = true
	}
	loadmon.StampReplicas(g.reports) // for loadmon.ModeScaled, as the load monitor does
	if g.idx == 0 {
		s.sample()
	}
	s.push(event{at: s.now + s.cfg.PollInterval, kind: evPoll, idx: g.idx})
}

// evict trims the policy's trees and queues the next eviction.
func (g *gateway) evict() {
	g.evictor.Evict()
	g.evictAdapters()
	g.s.push(event{at: g.s.now + g.s.cfg.PolicyConfig.CacheAware.EvictionInterval, kind: evEvict, idx: g.idx})
}

// rankOf is what a simulated engine's /v1/loads says (internal/sim serves the same fields): the
// gateway's load monitor and this simulator then fold it with the same loadmon.ReportOf. Its
// num_waiting_uncached_tokens is the engine's whole prefill backlog (engine.Load.PrefillTokens):
// SGLang keeps a request in its waiting queue until its prefill starts, where the engine model
// admits requests to the batch first and prefills them in chunks, so the model's queued tokens
// alone would hide most of the prefill ahead of a new request.
func rankOf(l engine.Load) loadmon.Rank {
	return loadmon.Rank{
		Running: float64(l.Running), Waiting: float64(l.Waiting),
		WaitingUncachedTokens: float64(l.PrefillTokens), HasUncached: true,
		UsedTokens: float64(l.UsedTokens), MaxTokens: float64(l.MaxTokens), MaxRunning: float64(l.MaxRunning),
		TokenUsage: l.TokenUsage, HasUsage: true,
		GenThroughput: l.GenThroughput, HasThroughput: true,
		CacheHitRate: l.CacheHitRate, HasHitRate: true,
		PrefillBusyTokens: float64(l.PrefillBusyTokens), PrefillBusyMicros: l.PrefillBusySeconds * 1e6,
		HasBusy: true,
	}
}

// report returns the last report for engine i and whether it is fresh.
func (g *gateway) report(i int) (loadmon.Report, bool) {
	if !g.polled[i] {
		return loadmon.Report{}, false
	}
	r := g.reports[i]
	return r, epoch.Add(g.s.now).Sub(r.PolledAt) <= g.s.cfg.StaleAfter
}

// engineOf returns the engine index of one of this gateway's workers.
func (g *gateway) engineOf(w *worker.Worker) (int, bool) {
	i, ok := g.index[w]
	return i, ok
}

// Load returns w's load as this gateway sees it, by loadmon.Effective.
func (g *gateway) Load(w *worker.Worker) int64 {
	i, ok := g.index[w]
	if !ok {
		return w.Inflight()
	}
	r, fresh := g.report(i)
	return loadmon.Effective(g.s.cfg.LoadMode, w.Inflight(), r, fresh)
}

// Report returns w's last fresh report.
func (g *gateway) Report(w *worker.Worker) (loadmon.Report, bool) {
	i, ok := g.index[w]
	if !ok {
		return loadmon.Report{}, false
	}
	r, fresh := g.report(i)
	if !fresh {
		return loadmon.Report{}, false
	}
	return r, true
}
