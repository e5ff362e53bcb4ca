package gateway

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// FlowConfig configures flow control: the per-model queue with late binding, priorities,
// tenants and their limits (package flow). The zero value is off.
type FlowConfig struct {
	flow.Config
	// TenantHeader, when set, names the request header whose value is the request's tenant
	// (before the key's name). Only a trusted front that sets or strips it may sit before the
	// gateway: any client can send it. Empty (the default): tenants are key names only.
	TenantHeader string
	// Now is the clock; nil means time.Now. Tests inject it.
	Now func() time.Time
}

// Headers a client may send to flow control.
const (
	// PriorityHeader carries the request's priority, an integer, higher first; honoured only
	// from keys with the priority permission.
	PriorityHeader = "X-Kvgate-Priority"
	// TTFTSLOHeader carries the request's time-to-first-token objective in milliseconds: a
	// request whose best predicted TTFT already exceeds it is answered 429 at once, and one
	// queued longer than it leaves the queue.
	TTFTSLOHeader = "X-Kvgate-Ttft-Slo-Ms"
)

// flowGate is the gateway's flow control: package flow's queue and limits, driven in real time.
// A request is admitted at once while its model's queue is empty and the pool has headroom;
// else it waits on its own channel until a dispatch grants it, its client leaves, or its
// deadline passes. Dispatch runs where capacity may have appeared: a request finishing, a load
// report being published, a worker's health changing, an arrival, and the moment an engine held
// back only by its queued prefill is predicted to drain below the bound (a timer: prefill drains
// without an event). The routing decision is made only once a request is granted (late
// binding). Each worker's saturation is judged on a loadmon.Estimate of it, told of every request
// this gateway sends it and sees finish, so that it is current between load reports.
type flowGate struct {
	s        *Server
	cfg      flow.Config
	header   string
	now      func() time.Time
	tenants  *flow.Tenants
	limiter  *flow.Limiter
	identity keyIdentities
	metrics  *flowMetrics

	// picking serializes a first attempt's judgement of which engines can start it, its pick
	// and the record of the send (flowTicket.choose): two requests judged at once would both
	// see one free slot and both take it.
	picking sync.Mutex

	mu      sync.Mutex
	models  map[string]*modelFlow
	engines map[*worker.Worker]*loadmon.Estimate
	stopped bool
	// drainAt is when the dispatcher is to run next for an engine's prefill to have drained
	// (zero: not armed); wake tells the dispatcher goroutine that it changed.
	drainAt time.Time
	wake    chan struct{}
	// queued counts the entries of every queue, so that a finishing request takes the lock
	// only when someone waits.
	queued atomic.Int64

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// onQueued, when set (tests), is called after a request joined a queue.
	onQueued func()
	// onDrain, when set (tests), is called with g.mu held each time the drain timer is armed
	// earlier, with when it is to fire.
	onDrain func(at time.Time)
}

// modelFlow is one model's admission (package flow: its queue and saturation gate) and its
// admitted requests that have not picked a worker yet.
type modelFlow struct {
	model   string
	a       *flow.Admission
	q       *flow.Queue // a.Queue
	pending atomic.Int64
	wait    map[flowLabels]waitObserver
}

// waiter is a queued request: its entry, and the channel closed when it is granted (or shed).
type waiter struct {
	e     flow.Entry
	ready chan struct{}
	shed  flow.Reason
	lbl   flowLabels
}

// flowTicket is an admitted request's hold on its model's pending count: released when the
// request first picks a worker (from then on the worker's in-flight count holds it), and its
// finish triggers a dispatch. It also tells the gate's estimate of the worker it was sent to
// that it was sent, and that it ended. The zero value holds nothing.
type flowTicket struct {
	g      *flowGate
	mf     *modelFlow
	picked bool
	// kv is the request's prompt tokens (its estimate from the body), sentTo the worker the
	// last attempt was sent to, nil before one.
	kv     float64
	sentTo *worker.Worker
}

// startable returns the filter of the request's first attempt (policy.Request.Startable): the
// candidates that can start it when the queue admitted it; nil (no filter) otherwise.
func (t *flowTicket) startable() func([]*worker.Worker) []*worker.Worker {
	if t.mf == nil {
		return nil
	}
	return t.g.startable
}

// choose runs a pick (choose, with the engines that can start the request as req.Startable on
// a first attempt) and records its send, then releases the pending hold: the request is counted
// pending or sent to its engine throughout, and a first attempt's judgement, pick and send are
// one step against every other first attempt, so two cannot both take one free slot.
func (t *flowTicket) choose(first bool, req *policy.Request, choose func() *worker.Worker) *worker.Worker {
	if t.mf == nil {
		return choose()
	}
	if first {
		req.Startable = t.startable()
		t.g.picking.Lock()
		defer t.g.picking.Unlock()
	}
	w := choose()
	t.sent(w, &req.Decision)
	t.pick()
	return w
}

// pick releases the pending hold once the request is about to reach a worker.
func (t *flowTicket) pick() {
	if t.mf != nil && !t.picked {
		t.picked = true
		t.mf.pending.Add(-1)
	}
}

// sent tells the estimate that the request went to w, its decision d predicting what of it w
// holds cached; an attempt before it (a retry) has ended.
func (t *flowTicket) sent(w *worker.Worker, d *policy.Decision) {
	if t.mf == nil || w == nil {
		return
	}
	uncached := t.kv
	if d.HasCost {
		uncached = max(d.Chosen.Prompt-d.Chosen.Cached, 0)
	} else if d.HasPrediction && d.WholePrompt {
		uncached *= 1 - d.Predicted
	}
	g := t.g
	g.mu.Lock()
	if t.sentTo != nil {
		g.engine(t.sentTo).Finished(loadmon.Own, t.kv)
	}
	g.engine(w).Sent(loadmon.Own, t.kv, uncached)
	g.mu.Unlock()
	t.sentTo = w
}

// done ends the request's hold and lets queued requests use what it freed.
func (t *flowTicket) done() {
	if t.mf == nil {
		return
	}
	t.pick()
	if t.sentTo != nil {
		t.g.mu.Lock()
		t.g.engine(t.sentTo).Finished(loadmon.Own, t.kv)
		t.g.mu.Unlock()
		t.sentTo = nil
	}
	if t.g.queued.Load() > 0 {
		t.g.dispatch(t.mf)
	}
	t.mf = nil
}

func newFlowGate(s *Server, c FlowConfig, apiKeys []string) *flowGate {
	now := c.Now
	if now == nil {
		now = time.Now
	}
	cfg := c.Config.WithDefaults()
	tenants := flow.NewTenants(cfg)
	return &flowGate{s: s, cfg: cfg, header: http.CanonicalHeaderKey(c.TenantHeader), now: now, tenants: tenants,
		limiter: flow.NewLimiter(tenants, now()), identity: newKeyIdentities(apiKeys), metrics: newFlowMetrics(tenants),
		models: map[string]*modelFlow{}, engines: map[*worker.Worker]*loadmon.Estimate{}, wake: make(chan struct{}, 1)}
}

// start runs the load-report watcher until stop.
func (g *flowGate) start(ctx context.Context) {
	u, ok := g.s.loads.(interface{ Updates() <-chan struct{} })
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel != nil || g.stopped {
		return
	}
	ctx, g.cancel = context.WithCancel(ctx)
	g.wg.Add(1)
	go g.run(ctx, u.Updates())
}

// run is the dispatcher goroutine: it dispatches on every load report, and when the drain timer
// fires, until ctx ends.
func (g *flowGate) run(ctx context.Context, updates <-chan struct{}) {
	defer g.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-updates:
			g.dispatchAll()
		case <-timer.C:
			g.mu.Lock()
			g.drainAt = time.Time{}
			g.mu.Unlock()
			g.dispatchAll()
		case <-g.wake:
			g.mu.Lock()
			at := g.drainAt
			g.mu.Unlock()
			if !at.IsZero() {
				timer.Reset(max(at.Sub(g.now()), 0))
			}
		case <-ctx.Done():
			return
		}
	}
}

// armDrain asks the dispatcher to run after d, unless it is to run sooner; g.mu is held.
func (g *flowGate) armDrain(d time.Duration) {
	at := g.now().Add(d)
	if !g.drainAt.IsZero() && !at.Before(g.drainAt) {
		return
	}
	g.drainAt = at
	if g.onDrain != nil {
		g.onDrain(at)
	}
	select {
	case g.wake <- struct{}{}:
	default: // a wake is pending: it reads drainAt
	}
}

// stop ends the watcher and answers every queued request 503: the gateway is shutting down.
func (g *flowGate) stop() {
	g.mu.Lock()
	g.stopped = true
	cancel := g.cancel
	for _, mf := range g.models {
		for e := mf.q.Pop(g.now()); e != nil; e = mf.q.Pop(g.now()) {
			w := e.Owner.(*waiter)
			g.left(mf, w)
			w.shed = flow.ReasonShutdown
			close(w.ready)
		}
	}
	g.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	g.wg.Wait()
}

// forgetWorker drops what the gate learned of a worker that left.
func (g *flowGate) forgetWorker(w *worker.Worker) {
	g.mu.Lock()
	delete(g.engines, w)
	g.mu.Unlock()
}

// flowRequest is what admission knows of one request.
type flowRequest struct {
	model      string
	candidates []*worker.Worker
	pol        policy.Policy
	preq       *policy.Request
	body       *Body // nil in tests that admit without one
	bytes      int64
	priority   int
	hasBodyPri bool
	bodyPri    int64
}

// flowRefusal is a request flow control answered itself.
type flowRefusal struct {
	status int
	code   string
	msg    string
	retry  time.Duration
	reason flow.Reason
}

// identify returns the request's tenant (its name, and the settings it takes) and priority: the
// tenant header's value when that is on and sent, else the key's name; the priority the client
// sent when its key may set one, else the tenant's.
func (g *flowGate) identify(r *http.Request, fr *flowRequest) (name string, tn *flow.Tenant, prio int, bad *flowRefusal) {
	name, mayPrioritize := g.identity.lookup(bearer(r))
	if g.header != "" {
		if h := r.Header.Get(g.header); h != "" {
			if !flow.ValidTenantName(h) {
				return "", nil, 0, &flowRefusal{status: http.StatusBadRequest, code: "invalid_request", msg: "the tenant header must be 1-64 letters, digits, '_', '.' or '-'"}
			}
			name = h
		}
	}
	tn = g.tenants.Lookup(name)
	prio = tn.Priority
	if mayPrioritize {
		if h := r.Header.Get(PriorityHeader); h != "" {
			p, err := flow.ParsePriority(h)
			if err != nil {
				return "", nil, 0, &flowRefusal{status: http.StatusBadRequest, code: "invalid_request", msg: PriorityHeader + " must be an integer"}
			}
			prio = p
		} else if fr.hasBodyPri {
			prio = flow.FromVLLMPriority(fr.bodyPri)
		}
	}
	return name, tn, prio, nil
}

// admit decides one request: it returns with t holding the request's admission, or a refusal
// to answer. It blocks while the request is queued.
func (g *flowGate) admit(r *http.Request, fr *flowRequest, t *flowTicket) *flowRefusal {
	name, tn, prio, bad := g.identify(r, fr)
	if bad != nil {
		return bad
	}
	fr.priority = prio
	lbl := flowLabels{model: fr.model, band: prio, tenant: tn.Name}
	tokens := max(g.cfg.Saturation.Estimate.Tokens(fr.bytes), 1) // the engine estimate's bytes-to-tokens rule
	now := g.now()
	if g.limiter.Active() {
		if ok, reason, retry := g.limiter.Allow(tn, tokens, now); !ok {
			g.metrics.shed(fr.model, reason)
			what := "requests per second"
			if reason == flow.ReasonRateTokens {
				what = "prompt tokens per second"
			}
			return &flowRefusal{status: http.StatusTooManyRequests, code: "rate_limited", retry: retry, reason: reason,
				msg: fmt.Sprintf("the tenant %q is over its limit of %s", tn.Name, what)}
		}
	}
	var deadline time.Time
	if v := r.Header.Get(TTFTSLOHeader); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 1 || ms > 3_600_000 {
			return &flowRefusal{status: http.StatusBadRequest, code: "invalid_request", msg: TTFTSLOHeader + " must be an integer of milliseconds in [1, 3600000]"}
		}
		slo := time.Duration(ms) * time.Millisecond
		if c, ok := fr.pol.(policy.Coster); ok {
			if best, ok := c.BestCost(r.Context(), fr.candidates, fr.preq); ok && best > slo.Seconds() {
				g.metrics.shed(fr.model, flow.ReasonSLO)
				return &flowRefusal{status: http.StatusTooManyRequests, code: "ttft_slo_unmet", reason: flow.ReasonSLO,
					retry: time.Duration((best - slo.Seconds()) * float64(time.Second)),
					msg:   fmt.Sprintf("the best predicted time to first token (%d ms) exceeds the request's objective of %d ms", int64(best*1000), ms)}
			}
		}
		deadline = now.Add(slo)
	}
	if !anyAvailable(fr.candidates) {
		return nil // nothing can serve it now: the proxy answers 503 as without a queue
	}
	g.mu.Lock()
	mf := g.model(fr.model)
	t.g, t.mf, t.kv = g, mf, tokens
	if mf.a.AdmitNow(g.pool(fr.candidates, fr.pol), float64(mf.pending.Load())) {
		mf.pending.Add(1)
		g.observeWait(mf, lbl, 0)
		g.mu.Unlock()
		return nil
	}
	if g.stopped {
		g.mu.Unlock()
		t.mf = nil
		g.metrics.shed(fr.model, flow.ReasonShutdown)
		return &flowRefusal{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "the gateway is shutting down", reason: flow.ReasonShutdown}
	}
	w := &waiter{ready: make(chan struct{}), lbl: lbl}
	w.e = flow.Entry{Tenant: name, Weight: tn.Weight, Priority: prio, Cost: tokens, Bytes: fr.bytes, Deadline: deadline, Owner: w}
	if err := mf.q.Push(&w.e, now); err != nil {
		g.mu.Unlock()
		t.mf = nil
		reason := flow.ReasonQueueFull
		if err == flow.ErrBytes {
			reason = flow.ReasonQueueBytes
		}
		g.metrics.shed(fr.model, reason)
		return &flowRefusal{status: http.StatusTooManyRequests, code: "queue_full", reason: reason, retry: time.Second,
			msg: fmt.Sprintf("the queue for model %q is full", fr.model)}
	}
	g.queued.Add(1)
	g.metrics.queue.WithLabelValues(lbl.values()...).Inc()
	g.dispatchLocked(mf, fr.candidates, fr.pol)
	g.mu.Unlock()
	if fr.body != nil {
		fr.body.shrink() // the queue holds the body's bytes, not a pooled buffer
	}
	if g.onQueued != nil {
		g.onQueued()
	}
	return g.await(r.Context(), mf, w, fr, t)
}

// await waits for the queued request's grant, its client's leaving or its deadline.
func (g *flowGate) await(ctx context.Context, mf *modelFlow, w *waiter, fr *flowRequest, t *flowTicket) *flowRefusal {
	timer := time.NewTimer(max(w.e.Deadline.Sub(g.now()), 0))
	defer timer.Stop()
	var timedOut bool
	select {
	case <-w.ready:
	case <-ctx.Done():
	case <-timer.C:
		timedOut = true
	}
	g.mu.Lock()
	removed := mf.q.Remove(&w.e)
	if removed {
		g.left(mf, w)
	}
	g.mu.Unlock()
	switch {
	case !removed && w.shed != "":
		t.mf = nil
		g.metrics.shed(fr.model, w.shed)
		return &flowRefusal{status: http.StatusServiceUnavailable, code: "shutting_down", msg: "the gateway is shutting down", reason: w.shed}
	case !removed && ctx.Err() == nil:
		return nil // granted
	case !removed:
		// Granted as the client left: give the slot back.
		t.done()
		g.metrics.canceled.WithLabelValues(fr.model).Inc()
		return &flowRefusal{status: StatusClientClosed}
	case !timedOut:
		t.mf = nil
		g.metrics.canceled.WithLabelValues(fr.model).Inc()
		return &flowRefusal{status: StatusClientClosed}
	}
	t.mf = nil
	if !anyAvailable(fr.candidates) {
		g.metrics.shed(fr.model, flow.ReasonNoWorker)
		return &flowRefusal{status: http.StatusServiceUnavailable, code: "no_available_worker", reason: flow.ReasonNoWorker,
			msg: fmt.Sprintf("no worker of model %q became available while the request was queued", fr.model)}
	}
	g.metrics.shed(fr.model, flow.ReasonTimeout)
	msg := fmt.Sprintf("the request waited %s in the queue for model %q without an engine free to take it", g.cfg.Timeout, fr.model)
	if w.e.ShortDeadline() {
		msg = fmt.Sprintf("the request waited its time-to-first-token objective in the queue for model %q", fr.model)
	}
	return &flowRefusal{status: http.StatusTooManyRequests, code: "queue_timeout", reason: flow.ReasonTimeout, retry: time.Second, msg: msg}
}

// left accounts an entry that left the queue; g.mu is held.
func (g *flowGate) left(mf *modelFlow, w *waiter) {
	g.queued.Add(-1)
	g.metrics.queue.WithLabelValues(w.lbl.values()...).Dec()
}

// model returns the model's queue, creating it; g.mu is held.
func (g *flowGate) model(m string) *modelFlow {
	mf := g.models[m]
	if mf == nil {
		a := flow.NewAdmission(g.cfg, g.now)
		mf = &modelFlow{model: m, a: a, q: a.Queue, wait: map[flowLabels]waitObserver{}}
		g.models[m] = mf
	}
	return mf
}

// dispatch grants what the model's pool can take now.
func (g *flowGate) dispatch(mf *modelFlow) {
	pool := g.s.reg.View().Pool(mf.model)
	if pool == nil {
		return // the model left; its queued requests time out, finding no worker
	}
	pol, err := g.s.router.For(mf.model, worker.Regular)
	if err != nil {
		return
	}
	g.mu.Lock()
	g.dispatchLocked(mf, pool.Regular, pol)
	g.mu.Unlock()
}

// dispatchAll grants what every model's pool can take now (a load report arrived, a worker's
// health changed).
func (g *flowGate) dispatchAll() {
	if g.queued.Load() == 0 {
		return
	}
	g.mu.Lock()
	mfs := make([]*modelFlow, 0, len(g.models))
	for _, mf := range g.models {
		if mf.q.Len() > 0 {
			mfs = append(mfs, mf)
		}
	}
	g.mu.Unlock()
	for _, mf := range mfs {
		g.dispatch(mf)
	}
}

// dispatchLocked grants queued requests, best first, while the pool has headroom beyond the
// admitted requests that have not picked a worker yet (flow.Admission.Dispatch), and arms the
// drain timer when only the engines' queued prefill holds the queue; g.mu is held.
func (g *flowGate) dispatchLocked(mf *modelFlow, candidates []*worker.Worker, pol policy.Policy) {
	if mf.q.Len() == 0 {
		return
	}
	pending := func() float64 { return float64(mf.pending.Load()) }
	if next := mf.a.Dispatch(g.pool(candidates, pol), pending, func(e *flow.Entry, now time.Time) {
		w := e.Owner.(*waiter)
		g.left(mf, w)
		mf.pending.Add(1)
		g.observeWait(mf, w.lbl, now.Sub(e.Enqueued))
		close(w.ready)
	}); next > 0 {
		g.armDrain(next)
	}
}

// observeWait records a dispatched request's queue wait; g.mu is held.
func (g *flowGate) observeWait(mf *modelFlow, lbl flowLabels, d time.Duration) {
	o := mf.wait[lbl]
	if o == nil {
		o = g.metrics.wait.WithLabelValues(lbl.values()...)
		mf.wait[lbl] = o
	}
	o.Observe(d.Seconds())
}

func anyAvailable(ws []*worker.Worker) bool {
	for _, w := range ws {
		if w.Available() {
			return true
		}
	}
	return false
}

// writeRefusal answers a request flow control refused, with Retry-After in whole seconds (at
// least 1) for a 429.
func writeRefusal(w http.ResponseWriter, f *flowRefusal, id string) {
	if f.status == StatusClientClosed {
		return
	}
	if f.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(f.retry.Seconds()))), 10))
	}
	msg := f.msg
	if id != "" {
		msg += " (request id " + id + ")"
	}
	writeError(w, f.status, f.code, msg)
}
