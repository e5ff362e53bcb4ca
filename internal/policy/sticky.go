package policy

import (
	"cmp"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/lru"
	"github.com/kvgate/kvgate/internal/worker"
)

// Branches of the sticky wrapper, as reported by Decisions and Request.Decision.
const (
	// BranchSticky: the request went to the worker its session is bound to.
	BranchSticky = "sticky"
	// BranchStickyMoved: the session's worker was gone or unavailable, so the session moved to
	// the next available worker in rendezvous order of its key, and is bound there now.
	BranchStickyMoved = "sticky_moved"
	// BranchStickySaturated: the session's worker was saturated, so this one request went to the
	// session's next worker in rendezvous order; the session stays bound to its worker.
	BranchStickySaturated = "sticky_saturated"
	// BranchStickyNew: a new session was bound to the first unsaturated worker in rendezvous
	// order of its key (placement "hash").
	BranchStickyNew = "sticky_new"
	// BranchPolicy counts the requests a wrapped policy without branches decided (new or
	// keyless sessions).
	BranchPolicy = "policy"
)

// StickyConfig configures sticky sessions (the Sticky wrapper around any policy).
type StickyConfig struct {
	// Enabled wraps every policy in Sticky. Default false.
	Enabled bool `yaml:"sticky_sessions"`
	// TTL is how long a session stays bound after its last request. Default 30 min.
	TTL time.Duration `yaml:"sticky_session_ttl"`
	// MaxSessions bounds the session table of one model; the least recently used session is
	// dropped past it. Each entry holds the key (up to MaxKeyBytes) and ~100 bytes. Default 100000.
	MaxSessions int `yaml:"sticky_max_sessions"`
	// QueueRatio defines saturation: a worker whose engine reports a queue (so its running
	// requests are all it can hold now) is saturated when its effective load exceeds its running
	// requests by more than QueueRatio × running, i.e. when a new request would wait behind more
	// than QueueRatio of a full batch. Default 0.25.
	QueueRatio float64 `yaml:"sticky_queue_ratio"`
	// Placement is how a new session finds its worker: "hash" (the default, also for "") puts it
	// on the first unsaturated worker in rendezvous order of its key, so that every gateway
	// replica binds it alike; "policy" asks the wrapped policy, which knows the workers' caches
	// but decides per replica.
	Placement string `yaml:"sticky_placement"`
}

// Placements of a new sticky session.
const (
	PlaceHash   = "hash"
	PlacePolicy = "policy"
)

// MaxKeyBytes is the longest session key kept; longer keys are hashed down to 64 bits, so a
// hostile client cannot make the table hold large strings.
const MaxKeyBytes = 128

// defaultSticky returns the sticky defaults (disabled).
func defaultSticky() StickyConfig {
	return StickyConfig{TTL: 30 * time.Minute, MaxSessions: 100_000, QueueRatio: 0.25}
}

// validate reports the first invalid sticky knob.
func (c StickyConfig) validate() error {
	switch {
	case c.TTL < 0:
		return errors.New("sticky_session_ttl must be >= 0")
	case c.MaxSessions < 0:
		return errors.New("sticky_max_sessions must be >= 0")
	case c.QueueRatio < 0:
		return errors.New("sticky_queue_ratio must be >= 0")
	case c.Placement != "" && c.Placement != PlaceHash && c.Placement != PlacePolicy:
		return errors.New("sticky_placement must be hash or policy")
	}
	return nil
}

// Recorder is implemented by policies with a view of the workers' caches (a prefix tree): Record
// tells them that req goes to w although they did not choose it, and sets req.Decision's
// prediction for w.
type Recorder interface {
	Record(req *Request, w *worker.Worker)
}

// SessionReporter is implemented by Sticky; the gateway's metrics read it at scrape time.
type SessionReporter interface {
	// Sessions returns the session table's size and lifetime counters.
	Sessions() SessionStats
}

// SessionStats describes a session table.
type SessionStats struct {
	// Active is the sessions bound now.
	Active int
	// Created, Expired and Evicted count sessions bound, dropped after TTL of silence, and
	// dropped to stay under MaxSessions.
	Created, Expired, Evicted uint64
}

// Sticky keeps each conversation on one worker. A request with a session key (Request.Key: a
// routing-key or session header, the body's prompt_cache_key or conversation, else the user) goes to the worker its
// session is bound to while that worker is available and not saturated; a new session is placed
// on the first unsaturated worker in rendezvous order of its key (or, with placement "policy",
// by the wrapped policy) and bound there. When the bound worker is gone (removed, not
// ready, circuit open) the session moves to the first available unsaturated worker in rendezvous
// order of its key and is bound there: only the sessions of the worker that left move, and every
// gateway replica moves them alike. A saturated worker's sessions spill, one request at a time,
// to that same rendezvous successor, so that repeated spills of a conversation build one second
// cache rather than many. Requests without a key go to the wrapped policy.
//
// Saturated means: when the worker's fresh load report shows a queue (its running requests are
// then all it can hold), an effective load above (1 + QueueRatio) × its running requests; with
// no fresh report or no queue, cache_aware's imbalance rule for this worker (load more than
// balance_abs_threshold above the least loaded candidate and more than balance_rel_threshold
// times it).
//
// The table is per policy instance, and the Router builds one policy per model, so sessions are
// scoped per model. It is bounded by MaxSessions (least recently used dropped first) and TTL.
// Create it with NewSticky; the zero value is not usable.
type Sticky struct {
	inner Policy
	rec   Recorder // inner as a Recorder, or nil
	// share is Config.Peers as a SessionShare (replica sync), or nil.
	share SessionShare
	cfg   StickyConfig
	bal   CacheAwareConfig
	loads Loads
	now   func() time.Time
	dec   *counters

	mu sync.Mutex
	// sessions maps a session key to its worker id, one entry a session, bounded by
	// MaxSessions; each entry's deadline is its last request + TTL, renewed on every request,
	// so recency order is deadline order and the cold end holds the expired sessions.
	sessions *lru.Cache[string, string]
	created  uint64
	own      atomic.Uint64 // BranchPolicy count when inner reports no branches
}

// Sticky forwards every optional interface of the package to the policy it wraps (a caller
// that finds one on Sticky reaches the inner policy's), so wrapping a policy never hides what it
// can do: TestWrappersForwardEveryInterface enumerates the package's interfaces to hold it so.
var (
	_ Policy           = (*Sticky)(nil)
	_ Forgetter        = (*Sticky)(nil)
	_ DecisionReporter = (*Sticky)(nil)
	_ SessionReporter  = (*Sticky)(nil)
	_ io.Closer        = (*Sticky)(nil)
	_ CacheObserver    = (*Sticky)(nil)
	_ Coster           = (*Sticky)(nil)
	_ TreeReporter     = (*Sticky)(nil)
	_ Opener           = (*Sticky)(nil)
	_ Evicter          = (*Sticky)(nil)
	_ Warmer           = (*Sticky)(nil)
	_ Recorder         = (*Sticky)(nil)
	_ DecisionTimer    = (*Sticky)(nil)
	_ Unwrapper        = (*Sticky)(nil)
	_ Preparer         = (*Sticky)(nil)
)

const (
	stSticky = iota
	stMoved
	stSaturated
	stNew
)

// NewSticky wraps inner; cfg gives the sticky knobs, the load view, the clock and the balance
// thresholds of the saturation rule.
func NewSticky(inner Policy, cfg Config) *Sticky {
	c := cfg.withDefaults()
	d := defaultSticky()
	c.Sticky.TTL = cmp.Or(c.Sticky.TTL, d.TTL)
	c.Sticky.MaxSessions = cmp.Or(c.Sticky.MaxSessions, d.MaxSessions)
	p := &Sticky{
		inner: inner, cfg: c.Sticky, bal: c.CacheAware, loads: c.Loads, now: c.Now,
		dec:      newCounters(BranchSticky, BranchStickyMoved, BranchStickySaturated, BranchStickyNew),
		sessions: lru.New[string, string](c.Sticky.MaxSessions),
	}
	p.rec, _ = inner.(Recorder)
	p.share, _ = c.Peers.(SessionShare)
	return p
}

// Name returns the wrapped policy's name: stickiness is a property of the deployment, and the
// name keys the load-awareness lookup and the metrics.
func (p *Sticky) Name() string { return p.inner.Name() }

// Inner returns the wrapped policy (Unwrapper).
func (p *Sticky) Inner() Policy { return p.inner }

// Pick routes req by its session, as the type's doc says.
func (p *Sticky) Pick(ctx context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
	if req.Key == "" {
		return p.pickInner(ctx, candidates, req)
	}
	key := sessionKey(req.Key)
	now := p.now()
	p.mu.Lock()
	bound := p.lookup(key, now)
	p.mu.Unlock()
	if bound == "" && p.share != nil {
		// Another replica may have bound it: the session's earlier turns reached it.
		if id, ok := p.share.SessionWorker(key); ok {
			bound = id
			p.bindLocal(key, id, now)
		}
	}
	if bound == "" {
		if p.cfg.Placement == PlacePolicy {
			w := p.pickInner(ctx, candidates, req)
			if w != nil {
				p.bind(key, w.ID, now)
			}
			return w
		}
		w := p.successor(candidates, key, nil)
		if w == nil {
			return nil
		}
		p.bind(key, w.ID, now)
		return p.sticky(req, w, stNew, BranchStickyNew)
	}
	var bw *worker.Worker
	for _, w := range candidates {
		if w.ID == bound {
			bw = w
			break
		}
	}
	if bw != nil && bw.Available() {
		if !p.saturated(bw, candidates) {
			return p.sticky(req, bw, stSticky, BranchSticky)
		}
		if w := p.successor(candidates, key, bw); w != nil {
			return p.sticky(req, w, stSaturated, BranchStickySaturated)
		}
		return p.sticky(req, bw, stSticky, BranchSticky) // every other worker is saturated too
	}
	w := p.successor(candidates, key, nil)
	if w == nil {
		return nil
	}
	p.bind(key, w.ID, now)
	return p.sticky(req, w, stMoved, BranchStickyMoved)
}

// Prepare prepares req for the wrapped policy when Pick will ask it: a request without a key,
// or, with placement "policy", one whose session is bound neither here nor at a peer. A
// session bound meanwhile wastes the preparation; one that expired meanwhile is placed by the
// wrapped policy unprepared (its fallback, the tree for precise_prefix).
func (p *Sticky) Prepare(ctx context.Context, candidates []*worker.Worker, req *Request) {
	if pr, ok := p.inner.(Preparer); ok && (req.Key == "" || p.asksInner(sessionKey(req.Key))) {
		pr.Prepare(ctx, candidates, req)
	}
}

// asksInner reports whether Pick would ask the wrapped policy for the session key (bounded by
// sessionKey): no live session here or at a peer, and placement "policy". It changes nothing.
func (p *Sticky) asksInner(key string) bool {
	if p.cfg.Placement != PlacePolicy {
		return false
	}
	now := p.now()
	p.mu.Lock()
	_, deadline, ok := p.sessions.Peek(key)
	p.mu.Unlock()
	if ok && !now.After(deadline) {
		return false
	}
	if p.share != nil {
		if _, ok := p.share.SessionWorker(key); ok {
			return false
		}
	}
	return true
}

// pickInner asks the wrapped policy.
func (p *Sticky) pickInner(ctx context.Context, candidates []*worker.Worker, req *Request) *worker.Worker {
	w := p.inner.Pick(ctx, candidates, req)
	if w != nil {
		if _, ok := p.inner.(DecisionReporter); !ok {
			p.own.Add(1)
		}
	}
	return w
}

// sticky records the decision to send req to w.
func (p *Sticky) sticky(req *Request, w *worker.Worker, counter int, branch string) *worker.Worker {
	p.dec.add(counter)
	if p.rec != nil {
		p.rec.Record(req, w)
	} else {
		req.decide("", 0, false)
	}
	req.Decision.Branch = branch
	return w
}

// successor returns the first available, unsaturated worker other than skip in rendezvous order
// of key; failing that, the first available one other than skip; nil when none.
func (p *Sticky) successor(candidates []*worker.Worker, key string, skip *worker.Worker) *worker.Worker {
	h := hashString(key)
	var best, bestAny *worker.Worker
	var bestScore, anyScore uint64
	for _, w := range candidates {
		if w == skip || !w.Available() {
			continue
		}
		s := score(h, w.ID)
		if bestAny == nil || s > anyScore {
			bestAny, anyScore = w, s
		}
		if (best == nil || s > bestScore) && !p.saturated(w, candidates) {
			best, bestScore = w, s
		}
	}
	if best != nil {
		return best
	}
	return bestAny
}

// saturated applies the saturation rule of the type's doc to w.
func (p *Sticky) saturated(w *worker.Worker, candidates []*worker.Worker) bool {
	load := p.loads.Load(w)
	if r, ok := p.loads.Report(w); ok && r.Waiting > 0 && r.Running > 0 {
		return float64(load-r.Running) > p.cfg.QueueRatio*float64(r.Running)
	}
	minLoad := load
	for _, c := range candidates {
		if c != w && c.Available() {
			minLoad = min(minLoad, p.loads.Load(c))
		}
	}
	return load-minLoad > p.bal.BalanceAbsThreshold && float64(load) > p.bal.BalanceRelThreshold*float64(minLoad)
}

// lookup returns the worker of key's live session, its deadline renewed (it is now the most
// recent), dropping it if it expired; "" when there is none. The caller holds mu.
func (p *Sticky) lookup(key string, now time.Time) string {
	id, ok := p.sessions.GetLive(key, now)
	if ok {
		p.sessions.AddUntil(key, id, 1, now.Add(p.cfg.TTL))
	}
	return id
}

// bind binds key to worker id as of now, making it the most recent session and dropping the
// least recent ones (or expired ones) past MaxSessions.
func (p *Sticky) bind(key, id string, now time.Time) {
	p.bindLocal(key, id, now)
	if p.share != nil {
		p.share.BindSession(key, id)
	}
}

// bindLocal is bind without telling the peers.
func (p *Sticky) bindLocal(key, id string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Drop up to two expired sessions from the cold end on every bind: with no sweeper goroutine,
	// sessions nobody asks for again still leave the table at least as fast as new ones come. A
	// new session past MaxSessions drops expired ones first (counted expired), then the least
	// recent live one (evicted, by the cache's bound).
	if _, _, ok := p.sessions.Peek(key); ok {
		p.sessions.AddUntil(key, id, 1, now.Add(p.cfg.TTL))
		p.sessions.Expire(now, 2)
		return
	}
	p.created++
	p.sessions.Expire(now, max(2, p.sessions.Len()+1-p.cfg.MaxSessions))
	p.sessions.AddUntil(key, id, 1, now.Add(p.cfg.TTL))
}

// sessionKey bounds a client-chosen key: keys up to MaxKeyBytes are kept as they are, longer
// ones become a fixed-size hash.
func sessionKey(k string) string {
	if len(k) <= MaxKeyBytes {
		return k
	}
	h := hashString(k)
	var b [17]byte
	b[0] = '#'
	const hexd = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		b[16-i] = hexd[h&0xf]
		h >>= 4
	}
	return string(b[:])
}

// Evict drops every expired session, then trims the wrapped policy (if it trims). The fleet
// simulator calls it; in the gateway expired sessions leave on lookup and on each new binding.
func (p *Sticky) Evict() {
	p.Sweep()
	if e, ok := p.inner.(Evicter); ok {
		e.Evict()
	}
}

// Sweep drops every session silent for longer than TTL. Lookups drop expired sessions as they
// meet them; Sweep frees the memory of those never asked for again.
func (p *Sticky) Sweep() {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sessions.Expire(now, -1)
}

// Forget tells the wrapped policy that the worker is gone. Its sessions stay bound: each moves,
// in rendezvous order, on its next request, so a worker that leaves moves only its own sessions.
func (p *Sticky) Forget(workerID string) {
	if f, ok := p.inner.(Forgetter); ok {
		f.Forget(workerID)
	}
}

// Decisions returns the wrapped policy's decisions (or BranchPolicy for one that counts none)
// plus sticky, sticky_moved, sticky_saturated and sticky_new.
func (p *Sticky) Decisions() map[string]uint64 {
	out := p.dec.snapshot()
	if d, ok := p.inner.(DecisionReporter); ok {
		for k, v := range d.Decisions() {
			out[k] += v
		}
	} else {
		out[BranchPolicy] = p.own.Load()
	}
	return out
}

// Opening returns what the wrapped policy's tree holds of text for several workers (Opener); 0
// when it keeps no tree.
func (p *Sticky) Opening(text string) int {
	if o, ok := p.inner.(Opener); ok {
		return o.Opening(text)
	}
	return 0
}

// TreeSizes returns the wrapped policy's tree sizes; nil when it keeps no tree.
func (p *Sticky) TreeSizes() map[string]int64 {
	if t, ok := p.inner.(TreeReporter); ok {
		return t.TreeSizes()
	}
	return nil
}

// Sessions returns the table's size and counters.
func (p *Sticky) Sessions() SessionStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := SessionStats{Active: p.sessions.Len(), Created: p.created}
	st.Expired, st.Evicted = p.sessions.Drops()
	return st
}

// Close closes the wrapped policy if it has background work.
func (p *Sticky) Close() error {
	if c, ok := p.inner.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Observed tells the wrapped policy, if it learns from what workers report cached. Without it
// the sticky wrapper would hide the observer and every decision would look unobserved.
func (p *Sticky) Observed(predicted, reported float64) {
	if o, ok := p.inner.(CacheObserver); ok {
		o.Observed(predicted, reported)
	}
}

// Learn tells the wrapped policy, if it learns from the answers (AnswerLearner).
func (p *Sticky) Learn(req *Request, a Answer) {
	if l, ok := p.inner.(AnswerLearner); ok {
		l.Learn(req, a)
	}
}

// Calibration asks the wrapped policy, if it keeps each worker's prediction error (Calibrator);
// nil otherwise.
func (p *Sticky) Calibration() map[string]float64 {
	if c, ok := p.inner.(Calibrator); ok {
		return c.Calibration()
	}
	return nil
}

// Capacities asks the wrapped policy, if it learns its workers' cache capacities
// (CapacityReporter); nil otherwise.
func (p *Sticky) Capacities() map[string]float64 {
	if c, ok := p.inner.(CapacityReporter); ok {
		return c.Capacities()
	}
	return nil
}

// Rates asks the wrapped policy, if it measures its workers' prefill rates (RateReporter); nil
// otherwise.
func (p *Sticky) Rates() map[string]float64 {
	if r, ok := p.inner.(RateReporter); ok {
		return r.Rates()
	}
	return nil
}

// Drifts asks the wrapped policy, if it checks its events against the answers
// (DriftReporter); nil otherwise.
func (p *Sticky) Drifts() map[string]Drift {
	if d, ok := p.inner.(DriftReporter); ok {
		return d.Drifts()
	}
	return nil
}

// WorkerDrift asks the wrapped policy (DriftReporter); zero otherwise.
func (p *Sticky) WorkerDrift(worker string) Drift {
	if d, ok := p.inner.(DriftReporter); ok {
		return d.WorkerDrift(worker)
	}
	return Drift{}
}

// BestCost asks the wrapped policy, if it prices its decisions (Coster); ok false otherwise.
// A session bound to a worker may not get the least cost; this is the fleet's best, which is
// what admission control needs.
func (p *Sticky) BestCost(ctx context.Context, candidates []*worker.Worker, req *Request) (float64, bool) {
	if c, ok := p.inner.(Coster); ok {
		return c.BestCost(ctx, candidates, req)
	}
	return 0, false
}

// Record tells the wrapped policy that req goes to w, if it keeps a view of the caches.
func (p *Sticky) Record(req *Request, w *worker.Worker) {
	if p.rec != nil {
		p.rec.Record(req, w)
	}
}

// DecisionTime asks the wrapped policy, if it times its decisions.
func (p *Sticky) DecisionTime() (n int64, mean time.Duration) {
	if d, ok := p.inner.(DecisionTimer); ok {
		return d.DecisionTime()
	}
	return 0, 0
}
