package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// FlowModel is the gateway's flow control in the simulator: every replica holds its requests
// in a package flow queue, with the same ordering, fairness, aging and saturation code the
// gateway runs, and dispatches them — picking the engine then, not at arrival — when an engine
// finishes a request, when a poll brings fresh reports, and on arrival. The zero value is off:
// every request goes to an engine on arrival.
//
// Each replica keeps a loadmon.Estimate of every engine, as the gateway does: told of every
// request it sends and sees finish, so that KV usage and queued prefill are current between
// polls. The pool takes no more, as in the gateway, while the cost-based policy (policy.Coster)
// predicts a wait at the bound on its best engine.
type FlowModel struct {
	// Config is the queue's configuration; Enabled turns the model on.
	flow.Config
	// Classes split the sessions among tenants and priorities: session k belongs to the class
	// whose cumulative share covers k mod the shares' sum, in order. Empty: one class, tenant
	// "" at priority 0.
	Classes []FlowClass
	// Only, when set, runs the sessions of this class label alone (the others are skipped), to
	// measure a class unloaded with exactly its own traffic.
	Only string
	// OnArrival dispatches every request on arrival, with the model's per-class accounting:
	// the baseline the queue is measured against.
	OnArrival bool
}

// FlowClass is one share of the sessions.
type FlowClass struct {
	// Tenant and Priority are the class's requests' tenant and priority.
	Tenant   string
	Priority int
	// Weight is the tenant's fair-share weight; 0 means 1.
	Weight float64
	// Share is the class's relative share of the sessions (at least 1).
	Share int
}

// Label names the class in reports: "tenant/priority".
func (c FlowClass) Label() string { return c.Tenant + "/p" + strconv.Itoa(c.Priority) }

// FlowReport is what the queue did in one run, per class.
type FlowReport struct {
	// Classes are per class, in FlowModel.Classes order.
	Classes []FlowClassReport
	// Shed counts the requests that left a queue unserved, by reason.
	Shed map[flow.Reason]int
	// MaxQueued is the largest queue length any replica held.
	MaxQueued int
	// Good counts the measured requests served with a TTFT within GoodTTFT.
	Good int
	// OwnPrefillP99 is the p99 over the measured served requests of their own uncached
	// prefill time at the engines' nominal speed, in seconds: what the run's own cache hits
	// left each request to prefill. Another order or placement hits the cache differently, so
	// it is no floor; IdealPrefillP99 is.
	OwnPrefillP99 float64
	// IdealPrefillP99 is the p99 over the measured arrivals of the prefill each would need on
	// one engine with an infinite cache sent every request in arrival order (bench.Ideal's
	// cache), at the engines' nominal speed, in seconds: every request's TTFT is at least its
	// own, so no dispatch order, placement or policy brings TTFT p99 below it.
	IdealPrefillP99 float64
}

// GoodTTFT is the TTFT objective of FlowReport.Good.
const GoodTTFT = 2 * time.Second

// FlowClassReport is one class's outcome.
type FlowClassReport struct {
	// Label is the class's label.
	Label string
	// Summary is the class's requests' summary (TTFT includes the queue wait).
	Summary bench.Summary
	// WaitP50, WaitP99 and WaitMax are the class's queue waits, in seconds, over the requests
	// dispatched after the warmup.
	WaitP50, WaitP99, WaitMax float64
	// Share is the class's share of the prompt tokens dispatched while every class had requests
	// queued (both backlogged); 0 when that never happened.
	Share float64
}

// classOf returns the class index of session id.
func (m *FlowModel) classOf(id int) int {
	if len(m.Classes) == 0 {
		return 0
	}
	total := 0
	for _, c := range m.Classes {
		total += max(c.Share, 1)
	}
	k := id % total
	for i, c := range m.Classes {
		if k -= max(c.Share, 1); k < 0 {
			return i
		}
	}
	return len(m.Classes) - 1
}

// flowSim is the flow model's state in one run.
type flowSim struct {
	s *sim
	m FlowModel
	// sat is the saturation judgement, its estimate's constants the routing cost's.
	sat     flow.Saturation
	classes []FlowClass
	gws     []*gwFlow
	colls   []bench.Collector
	waits   [][]float64
	// backlogged tokens dispatched per class while every class had requests queued.
	shareTok []float64
	shed     map[flow.Reason]int
	maxQ     int
	good     int
	own      []float64 // each measured request's own prefill time, seconds
	expired  []*flow.Entry
	// ideal is every block an infinite cache would hold, ideal each measured arrival's prefill
	// on it (FlowReport.IdealPrefillP99), keys a buffer.
	idealSeen map[uint64]struct{}
	ideal     []float64
	keys      []uint64
}

// gwFlow is one replica's admission (package flow's, as the gateway's) and what it reads.
type gwFlow struct {
	a *flow.Admission
	q *flow.Queue // a.Queue
	// eng is the replica's estimate of each engine between polls, as the gateway keeps it.
	eng []loadmon.Estimate
	// pool is the replica's engines as its admission reads them.
	pool replicaPool
	// open are the candidates that could start a request at the last judgement: a dispatched
	// request picks among them, as in the gateway.
	open     []*worker.Worker
	queuedBy []int // queued entries per class
	// deadline is the pending event for the queue's next deadline, kick the pending dispatch.
	deadline, kick pending
}

// pending is one kind of event a replica keeps at most one of in the simulator's heap: the
// earliest asked for. A later event of that kind already pushed is left in the heap and ignored
// when it comes (fires reports false).
type pending struct {
	armed bool
	at    time.Duration
}

// ask reports whether an event at at must be pushed: none is pending, or the pending one is later.
func (p *pending) ask(at time.Duration) bool {
	if p.armed && p.at <= at {
		return false
	}
	p.armed, p.at = true, at
	return true
}

// fires reports whether the event coming due at now is the pending one, which it then clears.
func (p *pending) fires(now time.Duration) bool {
	if p.at != now {
		return false // superseded by an earlier one
	}
	p.armed = false
	return true
}

// held is a queued turn.
type held struct {
	a       *active
	g       int
	turn    *bench.Turn
	arrived time.Duration
	class   int
}

func newFlowSim(s *sim) *flowSim {
	m := s.cfg.Flow
	fs := &flowSim{s: s, m: m, classes: m.Classes, shed: map[flow.Reason]int{}, idealSeen: map[uint64]struct{}{}}
	fs.sat = m.Saturation
	fs.sat.Estimate = s.cfg.PolicyConfig.Cost.Estimate()
	fs.sat = fs.sat.WithDefaults()
	if len(fs.classes) == 0 {
		fs.classes = []FlowClass{{Share: 1}}
	}
	fs.colls = make([]bench.Collector, len(fs.classes))
	for i := range fs.colls {
		fs.colls[i].Warmup = s.coll.Warmup
	}
	fs.waits = make([][]float64, len(fs.classes))
	fs.shareTok = make([]float64, len(fs.classes))
	cfg := m.Config
	cfg.Saturation = fs.sat
	clock := func() time.Time { return epoch.Add(s.now) }
	for g := range s.gws {
		n := len(s.engines)
		a := flow.NewAdmission(cfg, clock)
		gf := &gwFlow{a: a, q: a.Queue, eng: make([]loadmon.Estimate, n), queuedBy: make([]int, len(fs.classes))}
		gf.pool = replicaPool{fs: fs, g: g}
		fs.gws = append(fs.gws, gf)
	}
	return fs
}

// skip reports whether a session is left out of the run (FlowModel.Only).
func (fs *flowSim) skip(a *active) bool {
	return fs.m.Only != "" && fs.classes[fs.m.classOf(a.s.ID)].Label() != fs.m.Only
}

// enqueue holds the turn in replica g's queue, then dispatches what the pool can take.
func (fs *flowSim) enqueue(a *active, g int, t *bench.Turn) {
	c := fs.m.classOf(a.s.ID)
	cl := fs.classes[c]
	h := &held{a: a, g: g, turn: t, arrived: fs.s.now, class: c}
	text := t.Text()
	fs.idealArrival(text)
	e := &flow.Entry{Tenant: cl.Tenant, Weight: cl.Weight, Priority: cl.Priority, Cost: fs.sat.Estimate.Tokens(int64(len(text))), Bytes: int64(len(text)), Owner: h}
	if fs.m.OnArrival {
		fs.s.submit(a, g, t, fs.s.now, c)
		return
	}
	gf := fs.gws[g]
	if err := gf.q.Push(e, epoch.Add(fs.s.now)); err != nil {
		reason := flow.ReasonQueueFull
		if err == flow.ErrBytes {
			reason = flow.ReasonQueueBytes
		}
		fs.refuse(h, reason)
		return
	}
	gf.queuedBy[c]++
	fs.maxQ = max(fs.maxQ, gf.q.Len())
	fs.dispatch(g)
	fs.arm(g)
}

// idealArrival sends text to the infinite cache of FlowReport.IdealPrefillP99, keyed as the
// engines key it, and records the prefill it would need there when measured.
func (fs *flowSim) idealArrival(text string) {
	cfg := fs.s.engines[0].e.Config()
	n := engine.TokenCount(text)
	fs.keys = engine.BlockKeys(fs.keys[:0], text, cfg.BlockSize)
	m := 0
	for m < len(fs.keys) {
		if _, ok := fs.idealSeen[fs.keys[m]]; !ok {
			break
		}
		m++
	}
	for _, k := range fs.keys[m:] {
		fs.idealSeen[k] = struct{}{}
	}
	if fs.s.now >= fs.s.coll.Warmup && n > 0 {
		fs.ideal = append(fs.ideal, float64(n-min(m*cfg.BlockSize, n-1))/cfg.PrefillTPS)
	}
}

// refuse records a turn flow control answered itself, and ends its session (the client got a
// 429 or 503).
func (fs *flowSim) refuse(h *held, r flow.Reason) {
	fs.shed[r]++
	rec := bench.Record{Sent: h.arrived, Err: "flow: " + string(r)}
	fs.s.coll.Add(rec)
	fs.colls[h.class].Add(rec)
	fs.s.endSession()
}

// arm queues the replica's next deadline event, if earlier than the one queued.
func (fs *flowSim) arm(g int) {
	gf := fs.gws[g]
	at, ok := gf.q.NextDeadline()
	if !ok {
		return
	}
	if d := at.Sub(epoch); gf.deadline.ask(d) {
		fs.s.push(event{at: d, kind: evFlowDeadline, idx: g})
	}
}

// expire answers the replica's requests past their deadline.
func (fs *flowSim) expire(g int) {
	gf := fs.gws[g]
	if !gf.deadline.fires(fs.s.now) {
		return
	}
	fs.expired = gf.q.Expire(epoch.Add(fs.s.now), fs.expired[:0])
	for _, e := range fs.expired {
		h := e.Owner.(*held)
		gf.queuedBy[h.class]--
		fs.refuse(h, flow.ReasonTimeout)
	}
	fs.arm(g)
}

// dispatch submits queued turns of replica g, best first, while some engine has headroom
// (flow.Admission.Dispatch, the gateway's), and asks for a dispatch when only the engines'
// prefill stands in the way: it drains without an event.
func (fs *flowSim) dispatch(g int) {
	gf := fs.gws[g]
	if next := gf.a.Dispatch(gf.pool.judged(), nil, func(e *flow.Entry, _ time.Time) { fs.grant(g, e) }); next > 0 {
		fs.kickAt(g, fs.s.now+next)
	}
}

// grant submits the queued turn of e, which replica g's admission granted.
func (fs *flowSim) grant(g int, e *flow.Entry) {
	gf := fs.gws[g]
	backlogged := true
	for _, n := range gf.queuedBy {
		backlogged = backlogged && n > 0
	}
	h := e.Owner.(*held)
	gf.queuedBy[h.class]--
	if backlogged && len(gf.queuedBy) > 1 {
		fs.shareTok[h.class] += e.Cost
	}
	if fs.s.now >= fs.s.coll.Warmup {
		fs.waits[h.class] = append(fs.waits[h.class], (fs.s.now - h.arrived).Seconds())
	}
	// Late binding picks among the engines that can start the request, as the gateway's does.
	gf.open = gf.open[:0]
	for _, i := range gf.a.Open() {
		gf.open = append(gf.open, gf.pool.ws[i])
	}
	gw := fs.s.gws[g]
	gw.narrow = gf.open
	fs.s.submit(h.a, h.g, h.turn, h.arrived, h.class)
	gw.narrow = nil
}

// kick asks for a dispatch of replica g's queue at now, once: an engine finished a request.
// It runs as its own event because an engine's finish is handled while the simulator walks that
// engine's events, which a dispatch (a pick, a submit) must not disturb.
func (fs *flowSim) kick(g int) {
	if fs.gws[g].q.Len() > 0 {
		fs.kickAt(g, fs.s.now) // before any later kick asked for (an engine's drain)
	}
}

// kickAt asks for a dispatch of replica g's queue at at (the earliest asked for wins).
func (fs *flowSim) kickAt(g int, at time.Duration) {
	gf := fs.gws[g]
	if gf.kick.ask(at) {
		fs.s.push(event{at: at, kind: evFlowDispatch, idx: g})
	}
}

// kicked runs a dispatch kick asked for.
func (fs *flowSim) kicked(g int) {
	gf := fs.gws[g]
	if !gf.kick.fires(fs.s.now) {
		return
	}
	fs.dispatch(g)
}

// sentTo notes a prompt of kv tokens, uncached of them predicted to miss the cache, that
// replica g submitted to engine i.
func (fs *flowSim) sentTo(g, i int, kv, uncached float64) {
	fs.gws[g].eng[i].Sent(loadmon.Own, kv, uncached)
}

// ended notes the end of a request of kv tokens that replica g submitted to engine i.
func (fs *flowSim) ended(g, i int, kv float64) { fs.gws[g].eng[i].Finished(loadmon.Own, kv) }

// replicaPool is one replica's engines as its admission reads them (flow.Pool): the candidates
// of its policy, each judged on the replica's estimate of it as of its last fresh report.
type replicaPool struct {
	fs *flowSim
	g  int
	// ws are the candidate workers, idx their engines' indices, rebuilt by judged.
	ws  []*worker.Worker
	idx []int
}

// judged returns the pool with the replica's candidates of the moment.
func (p *replicaPool) judged() *replicaPool {
	gw := p.fs.s.gws[p.g]
	p.ws, p.idx = p.ws[:0], p.idx[:0]
	for i, w := range gw.workers {
		if gw.cands != nil && !slices.Contains(gw.cands, w) {
			continue
		}
		p.ws, p.idx = append(p.ws, w), append(p.idx, i)
	}
	return p
}

// Len returns the number of candidates.
func (p *replicaPool) Len() int { return len(p.ws) }

// Signals returns what the replica knows of candidate i at now.
func (p *replicaPool) Signals(i int, now time.Time) flow.Signals {
	w, e := p.ws[i], p.idx[i]
	sig := flow.Signals{Available: w.Available(), Inflight: w.Inflight()}
	if r, fresh := p.fs.s.gws[p.g].report(e); fresh {
		p.fs.sat.Judge(&sig, &p.fs.gws[p.g].eng[e], &r, now)
	}
	return sig
}

// BestWait returns the routing cost's predicted wait before a prompt-less request's prefill on
// the best engine, as the gateway asks it where the engines report no queued prefill.
func (p *replicaPool) BestWait() (float64, bool) {
	gw := p.fs.s.gws[p.g]
	c, ok := gw.pol.(policy.Coster)
	if !ok {
		return 0, false
	}
	return c.BestCost(context.Background(), gw.candidates(), nil)
}

// finished records a served request of class c.
func (fs *flowSim) finished(c int, rec bench.Record, tps float64) {
	fs.colls[c].Add(rec)
	if rec.Sent < fs.s.coll.Warmup {
		return
	}
	if rec.TTFT <= GoodTTFT {
		fs.good++
	}
	fs.own = append(fs.own, float64(rec.PromptTokens-rec.CachedTokens)/tps)
}

// report summarizes the run per class.
func (fs *flowSim) report(label string) *FlowReport {
	rep := &FlowReport{Shed: fs.shed, MaxQueued: fs.maxQ, Good: fs.good}
	if n := len(fs.own); n > 0 {
		slices.Sort(fs.own)
		rep.OwnPrefillP99 = fs.own[min(n-1, n*99/100)]
	}
	if n := len(fs.ideal); n > 0 {
		slices.Sort(fs.ideal)
		rep.IdealPrefillP99 = fs.ideal[min(n-1, n*99/100)]
	}
	var tot float64
	for _, t := range fs.shareTok {
		tot += t
	}
	for i, c := range fs.classes {
		cr := FlowClassReport{Label: c.Label(), Summary: fs.colls[i].Summarize(fmt.Sprintf("%s %s", label, c.Label()))}
		w := fs.waits[i]
		slices.Sort(w)
		if n := len(w); n > 0 {
			cr.WaitP50, cr.WaitP99, cr.WaitMax = w[n/2], w[min(n-1, n*99/100)], w[n-1]
		}
		if tot > 0 {
			cr.Share = fs.shareTok[i] / tot
		}
		rep.Classes = append(rep.Classes, cr)
	}
	return rep
}
