package fleet

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
)

// epoch is virtual time zero as a wall-clock time, for the clocks handed to policies and the
// PolledAt of reports. Fixed, so that nothing in a run depends on when it ran.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// eventKind says what a queued event does.
type eventKind uint8

const (
	evArrival      eventKind = iota // open loop: a new session arrives
	evTurn                          // a session's next turn is due
	evEngine                        // an engine's next event is due
	evPoll                          // a gateway polls every engine
	evEvict                         // a gateway trims its policy's trees
	evWorker                        // a worker change of Config.Failover (idx: its index)
	evWarmDeadline                  // a warm-up's time is up (idx: its index in sim.warms)
	evFlowDeadline                  // a queued request's deadline (idx: the gateway; flow.go)
	evFlowDispatch                  // capacity may have appeared: dispatch the gateway's queue
	evSync                          // a replica sync batch reaches gateway idx (ver: its id; sync.go)
)

// event is one entry of the queue. seq breaks ties in insertion order, which keeps runs
// deterministic.
type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	idx  int    // engine or gateway index
	ver  uint64 // evEngine: the engine's wake version when queued
	sess *active
}

// queue is a binary min-heap of events ordered by (at, seq). It is typed rather than built on
// container/heap, whose interface{} Push boxes every event: millions of allocations per run.
type queue []event

func (q queue) less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}

// push adds ev.
func (q *queue) push(ev event) {
	*q = append(*q, ev)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop removes and returns the earliest event; the queue must not be empty.
func (q *queue) pop() event {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = event{}
	h = h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// active is a session in progress.
type active struct {
	s    bench.Session
	next int // index of the next turn to send
	gw   int // the session's gateway under SpreadSession
}

// flight is a request in an engine.
type flight struct {
	sess    *active
	gw      int
	release func()
	first   func() // the first token arrived (worker.Worker.Awaiting)
	sent    time.Duration
	eng     int
	dec     policy.Decision // Predicted made a share of the whole prompt
	// text is the routing text the policy saw, for learning from the answer.
	text string
	// extra is decision time the simulated engine did not see (tokenization), added to the
	// request's latencies.
	extra time.Duration
	// wait is the time the request spent in the gateway's queue (flow.go), part of its TTFT;
	// class is its flow class.
	wait  time.Duration
	class int
	// kv is the prompt tokens flow control counted against the engine's KV cache (flow.go).
	kv float64
	// warm is set for a warm-up request (warm.go), which is no client's: nil for the others.
	warm *warmRun
}

// simEngine is one engine and its wake bookkeeping.
type simEngine struct {
	e       *engine.Engine
	ver     uint64        // bumped whenever the engine's next event may have changed
	queued  bool          // an evEngine for ver is in the queue
	queueAt time.Duration // and when
	backlog float64       // sum of sampled backlogs, for the load spread
	running float64       // sum of sampled running requests, for the mean batch
}

// sim is one run.
type sim struct {
	cfg   Config
	sched *bench.Schedule
	rng   *rand.Rand

	now     time.Duration
	seq     uint64
	q       queue
	engines []*simEngine
	gws     []*gateway
	flights map[uint64]*flight
	nextID  uint64
	// sessions counts sessions in progress plus a pending open-loop arrival; the run ends when
	// it and the flights reach zero.
	sessions int
	samples  int
	coll     bench.Collector
	evs      []engine.Event
	noWorker int
	ideal    *bench.Ideal
	// kv is the engines' KV-cache event feed, when a policy reads it.
	kv *kvFeed
	// warms are the warm-ups of added engines (warm.go); warmStats counts them, nil if none.
	warms     []*warmRun
	warmStats *bench.WarmStats
	// fq is the gateways' flow control (flow.go); nil when Config.Flow is off.
	fq *flowSim
	// bus is the modelled replica sync bus (sync.go); nil when Config.Sync is off.
	bus *syncBus
}

var _ Truth = (*sim)(nil)

// CachedPrefix returns how many leading tokens of text engine i holds now (Truth).
func (s *sim) CachedPrefix(i int, text string) int {
	s.syncEngine(i)
	return s.engines[i].e.CachedPrefix(text)
}

// Config returns engine i's configuration (Truth).
func (s *sim) Config(i int) engine.Config { return s.engines[i].e.Config() }

// Load returns engine i's load now (Truth).
func (s *sim) Load(i int) engine.Load {
	s.syncEngine(i)
	return s.engines[i].e.Load()
}

// Run simulates the workload of sched on the fleet cfg and returns its summary, labelled
// cfg.Label(). ctx cancels a long run between events.
func Run(ctx context.Context, cfg Config, sched *bench.Schedule) (bench.Summary, error) {
	sum, _, err := RunFlow(ctx, cfg, sched)
	return sum, err
}

// RunFlow is Run that also returns what flow control did, per class (nil when Config.Flow is
// off).
func RunFlow(ctx context.Context, cfg Config, sched *bench.Schedule) (bench.Summary, *FlowReport, error) {
	sum, s, err := run(ctx, cfg, sched)
	if err != nil || s.fq == nil {
		return sum, nil, err
	}
	return sum, s.fq.report(sum.Label), nil
}

func run(ctx context.Context, cfg Config, sched *bench.Schedule) (bench.Summary, *sim, error) {
	if err := cfg.Validate(); err != nil {
		return bench.Summary{}, nil, err
	}
	cfg = cfg.withDefaults()
	s := &sim{
		cfg:     cfg,
		sched:   sched,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
		flights: map[uint64]*flight{},
		ideal:   bench.NewIdeal(cfg.Engine.BlockSize),
	}
	s.coll.Warmup = sched.Limits().Warmup
	if cfg.Timeline > 0 {
		s.coll.Timeline = &bench.Timeline{Bucket: cfg.Timeline}
	}
	if err := s.build(); err != nil {
		return bench.Summary{}, nil, err
	}
	defer s.close()
	s.start()
	for n := 0; len(s.q) > 0; n++ {
		if n&0xfff == 0 && ctx.Err() != nil {
			return bench.Summary{}, nil, ctx.Err()
		}
		ev := s.q.pop()
		s.now = ev.at
		s.dispatch(ev)
	}
	sum := s.coll.Summarize(cfg.Label())
	sum.IdealHitRate = s.ideal.HitRate()
	canon, _ := canonical(cfg.Policy)
	sum.Policy, sum.Gateways, sum.Engines, sum.LoadMode = canon, cfg.Gateways, cfg.Engines, cfg.LoadMode.String()
	if len(cfg.GatewayWeights) > 0 {
		sum.Split = FormatSplit(cfg.GatewayWeights)
	}
	sum.Arrivals = sched.Arrivals().String()
	sum.Spread, sum.SpreadCV = s.spread(), s.spreadCV()
	sum.Stall, sum.Batch = s.stall(), s.batch()
	sum.Decisions = s.decisions()
	sum.Warm = s.warmStats
	if len(cfg.Failover) > 0 {
		sum.Recoveries = recoveries(cfg, s.coll.Warmup, sum.Timeline, nil)
	}
	return sum, s, nil
}

// build creates the engines and gateways.
func (s *sim) build() error {
	s.engines = make([]*simEngine, s.cfg.Engines)
	for i := range s.engines {
		e, err := engine.New(s.cfg.engineConfig(i))
		if err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
		s.engines[i] = &simEngine{e: e}
	}
	if usesEvents(s.cfg.Policy) {
		s.kv = newKVFeed(s)
	}
	if s.cfg.Sync.Enabled {
		s.bus = newSyncBus(s.cfg.Sync, s.cfg.Seed)
	}
	s.gws = make([]*gateway, s.cfg.Gateways)
	for g := range s.gws {
		gw, err := newGateway(s, g)
		if err != nil {
			return err
		}
		s.gws[g] = gw
	}
	if s.cfg.Flow.Enabled {
		s.fq = newFlowSim(s)
	}
	return nil
}

// close releases what the policies hold.
func (s *sim) close() {
	for _, g := range s.gws {
		if g != nil {
			g.close()
		}
	}
}

// push queues an event at at.
func (s *sim) push(ev event) {
	ev.seq = s.seq
	s.seq++
	s.q.push(ev)
}

// start queues the first sessions and the gateways' periodic work.
func (s *sim) start() {
	if s.sched.Arrivals().Closed() {
		for i := 0; i < s.sched.Arrivals().Concurrency; i++ {
			if !s.startSession(0) {
				break
			}
		}
	} else {
		s.queueArrival()
	}
	for _, g := range s.gws {
		g.schedule()
	}
	s.scheduleFailover()
}

// queueArrival queues the next open-loop session, if any.
func (s *sim) queueArrival() {
	sess, at, ok := s.sched.NextSession()
	if !ok {
		return
	}
	s.sessions++
	s.push(event{at: at, kind: evArrival, sess: s.newActive(sess)})
}

// startSession starts the next session now (closed loop) and reports whether there was one.
func (s *sim) startSession(at time.Duration) bool {
	if s.sched.Done(at) {
		return false
	}
	sess, _, ok := s.sched.NextSession()
	if !ok {
		return false
	}
	s.sessions++
	s.push(event{at: at, kind: evTurn, sess: s.newActive(sess)})
	return true
}

func (s *sim) newActive(sess bench.Session) *active {
	a := &active{s: sess}
	if s.cfg.Spread == SpreadSession {
		h := fnv.New64a()
		h.Write([]byte(sess.Key))
		if len(s.cfg.GatewayWeights) > 0 {
			a.gw = s.weightedGateway(float64(h.Sum64()>>11) / (1 << 53))
		} else {
			a.gw = int(h.Sum64() % uint64(len(s.gws)))
		}
	}
	return a
}

// weightedGateway returns the gateway that u, uniform in [0, 1), falls to under
// Config.GatewayWeights.
func (s *sim) weightedGateway(u float64) int {
	total := 0.0
	for _, w := range s.cfg.GatewayWeights {
		total += w
	}
	x := u * total
	for i, w := range s.cfg.GatewayWeights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(s.cfg.GatewayWeights) - 1
}

// dispatch handles one event at s.now.
func (s *sim) dispatch(ev event) {
	switch ev.kind {
	case evArrival:
		s.queueArrival()
		s.sendTurn(ev.sess)
	case evTurn:
		s.sendTurn(ev.sess)
	case evEngine:
		se := s.engines[ev.idx]
		if ev.ver != se.ver {
			return // superseded by a later wake
		}
		se.queued = false
		s.syncEngine(ev.idx)
	case evPoll:
		if s.live() {
			s.gws[ev.idx].poll()
			if s.fq != nil {
				s.fq.dispatch(ev.idx)
			}
		}
	case evFlowDeadline:
		s.fq.expire(ev.idx)
	case evFlowDispatch:
		s.fq.kicked(ev.idx)
	case evEvict:
		if s.live() {
			s.gws[ev.idx].evict()
		}
	case evWorker:
		s.change(ev.idx)
	case evWarmDeadline:
		s.warmDeadline(ev.idx)
	case evSync:
		s.deliverSync(ev.idx, ev.ver)
	}
}

// live reports whether anything is still to happen besides periodic gateway work.
func (s *sim) live() bool { return s.sessions > 0 || len(s.flights) > 0 }

// sendTurn sends the session's next turn through a gateway, or ends the session.
func (s *sim) sendTurn(a *active) {
	if a.next >= len(a.s.Turns) || !s.sched.Admit(s.now) {
		s.endSession()
		return
	}
	t := &a.s.Turns[a.next]
	a.next++
	g := a.gw
	if s.cfg.Spread == SpreadUniform && len(s.cfg.GatewayWeights) > 1 {
		g = s.weightedGateway(s.rng.Float64())
	} else if s.cfg.Spread == SpreadUniform && len(s.gws) > 1 {
		g = s.rng.IntN(len(s.gws))
	}
	if s.fq != nil {
		if s.fq.skip(a) {
			s.endSession()
			return
		}
		s.fq.enqueue(a, g, t)
		return
	}
	s.submit(a, g, t, s.now, 0)
}

// submit picks the engine for a turn that reached gateway g at arrived, and sends it there now;
// class is its flow class (flow.go).
func (s *sim) submit(a *active, g int, t *bench.Turn, arrived time.Duration, class int) {
	gw := s.gws[g]
	text := t.Text()
	w, idx := gw.pick(text, a.s.Key, t.Model)
	if w == nil {
		s.noWorker++
		s.coll.Add(bench.Record{Sent: arrived, Err: "no available worker"})
		s.endSession()
		return
	}
	id := s.nextID
	s.nextID++
	f := &flight{sess: a, gw: g, sent: arrived, wait: s.now - arrived, class: class, eng: idx, dec: gw.req.Decision, text: gw.req.Text}
	f.first, f.release = w.Track()
	if gw.kv != nil {
		// precise_prefix tokenized the prompt, and pays for that.
		f.extra = gw.kv.takeCost()
	}
	if !f.dec.WholePrompt {
		f.dec.Predicted = policy.PromptShare(f.dec.Predicted, len(gw.req.Text), len(text))
	}
	se := s.engines[idx]
	if err := se.e.Submit(s.now, engine.Request{ID: id, Text: text, MaxTokens: max(t.OutputTokens, 1), Adapter: t.Model}); err != nil {
		f.release()
		s.coll.Add(bench.Record{Sent: s.now, Err: err.Error()})
		s.endSession()
		return
	}
	s.flights[id] = f
	if s.bus != nil {
		s.publish(g)
	}
	if s.fq != nil {
		f.kv = float64(len(text)) / 4
		uncached := f.kv
		if f.dec.HasPrediction {
			uncached *= 1 - f.dec.Predicted
		}
		s.fq.sentTo(g, idx, f.kv, uncached)
	}
	s.ideal.Add(text, s.now >= s.coll.Warmup)
	s.wake(idx)
}

// endSession accounts a finished session; under a closed loop it starts the next one.
func (s *sim) endSession() {
	s.sessions--
	if s.sched.Arrivals().Closed() {
		s.startSession(s.now)
	}
}

// wake makes sure the queue holds the engine's next event.
func (s *sim) wake(i int) {
	se := s.engines[i]
	at, ok := se.e.NextEvent()
	if !ok {
		se.ver++
		se.queued = false
		return
	}
	at = max(at, s.now)
	if se.queued && se.queueAt == at {
		return
	}
	se.ver++
	se.queued, se.queueAt = true, at
	s.push(event{at: at, kind: evEngine, idx: i, ver: se.ver})
}

// syncEngine moves engine i to now, handles what happened, and queues its next event.
func (s *sim) syncEngine(i int) {
	se := s.engines[i]
	s.evs = se.e.Advance(s.now, s.evs[:0])
	for _, ev := range s.evs {
		switch ev.Kind {
		case engine.FirstToken:
			// The gateway sees the first byte of the streamed answer.
			if f, ok := s.flights[ev.ID]; ok && f.first != nil {
				f.first()
			}
		case engine.Finished:
			s.finish(ev)
		}
	}
	s.wake(i)
}

// finish records a finished request, frees its slot, and schedules the session's next turn.
func (s *sim) finish(ev engine.Event) {
	f, ok := s.flights[ev.ID]
	if !ok {
		return
	}
	delete(s.flights, ev.ID)
	if f.warm != nil {
		s.warmFinished(f, ev)
		return
	}
	f.release()
	if gw := s.gws[f.gw]; gw.node != nil {
		gw.node.Finished(simModel, gw.workers[f.eng].ID, "")
		s.publish(f.gw)
	}
	rec := bench.Record{
		Sent: f.sent, TTFT: ev.TTFT + f.extra + f.wait, E2E: ev.At - f.sent + f.extra,
		PromptTokens: ev.PromptTokens, CachedTokens: ev.CachedTokens, OutputTokens: ev.CompletionTokens,
		Worker: engineName(f.eng), Predicted: f.dec.Predicted, HasPrediction: f.dec.HasPrediction,
	}
	if ev.CompletionTokens > 1 {
		rec.ITL = (rec.E2E - rec.TTFT) / time.Duration(ev.CompletionTokens-1)
	}
	s.coll.Add(rec)
	if s.fq != nil {
		s.fq.ended(f.gw, f.eng, f.kv)
		s.fq.finished(f.class, rec, s.engines[f.eng].e.Config().PrefillTPS)
		s.fq.kick(f.gw)
	}
	if o, ok := s.gws[f.gw].pol.(policy.CacheObserver); ok && f.dec.HasPrediction && ev.PromptTokens > 0 {
		// The gateway compares the same two shares once the answer's usage arrives.
		o.Observed(f.dec.Predicted, float64(ev.CachedTokens)/float64(ev.PromptTokens))
	}
	if l, ok := policy.As[policy.AnswerLearner](s.gws[f.gw].pol); ok && f.dec.HasPrediction && ev.PromptTokens > 0 {
		// The gateway learns from the same answer (policy.AnswerLearner).
		req := policy.Request{Text: f.text, Decision: f.dec}
		l.Learn(&req, policy.Answer{Worker: f.dec.Worker, PromptTokens: ev.PromptTokens, CachedTokens: ev.CachedTokens})
	}
	a := f.sess
	if a.next >= len(a.s.Turns) {
		s.endSession()
		return
	}
	s.push(event{at: ev.At + a.s.Turns[a.next].Think, kind: evTurn, sess: a})
}

// sample adds every engine's backlog to the spread statistics.
func (s *sim) sample() {
	for _, se := range s.engines {
		l := se.e.Load()
		se.backlog += float64(l.Running + l.Waiting)
		se.running += float64(l.Running)
	}
	s.samples++
}

// stall returns the share of engine time by which decoding waited for prefill over the whole
// run (bench.Summary.Stall), rounded to 3 decimals.
func (s *sim) stall() float64 {
	if s.now <= 0 || len(s.engines) == 0 {
		return 0
	}
	var t time.Duration
	for _, se := range s.engines {
		t += se.e.Load().DecodeStall
	}
	return math.Round(float64(t)/float64(s.now)/float64(len(s.engines))*1000) / 1000
}

// batch returns the mean sampled running requests per engine, rounded to one decimal.
func (s *sim) batch() float64 {
	if s.samples == 0 || len(s.engines) == 0 {
		return 0
	}
	var sum float64
	for _, se := range s.engines {
		sum += se.running
	}
	return math.Round(sum/float64(s.samples)/float64(len(s.engines))*10) / 10
}

// spreadCV returns the coefficient of variation (standard deviation ÷ mean) of the engines'
// time-averaged backlogs, rounded to 3 decimals; 0 without samples or load. Unlike max/min it
// stays finite and meaningful on a large fleet, where one idle engine makes max/min infinite.
func (s *sim) spreadCV() float64 {
	if s.samples == 0 || len(s.engines) == 0 {
		return 0
	}
	var sum, sq float64
	for _, se := range s.engines {
		sum += se.backlog
	}
	m := sum / float64(len(s.engines))
	if m == 0 {
		return 0
	}
	for _, se := range s.engines {
		sq += (se.backlog - m) * (se.backlog - m)
	}
	return math.Round(math.Sqrt(sq/float64(len(s.engines)))/m*1000) / 1000
}

// spread returns max/min of the engines' mean sampled backlog, -1 when some engine was never
// loaded while another was, and 0 without samples.
func (s *sim) spread() float64 {
	if s.samples == 0 {
		return 0
	}
	lo, hi := s.engines[0].backlog, s.engines[0].backlog
	for _, se := range s.engines[1:] {
		lo, hi = min(lo, se.backlog), max(hi, se.backlog)
	}
	switch {
	case hi == 0:
		return 0
	case lo == 0:
		return -1
	}
	return float64(int64(hi/lo*1000+0.5)) / 1000
}

// decisions sums the policies' decision counts by branch over every gateway; nil when the
// policy does not count them.
func (s *sim) decisions() map[string]uint64 {
	var tot map[string]uint64
	for _, g := range s.gws {
		d, ok := g.pol.(policy.DecisionReporter)
		if !ok {
			return nil
		}
		if tot == nil {
			tot = map[string]uint64{}
		}
		for k, v := range d.Decisions() {
			tot[k] += v
		}
	}
	return tot
}
