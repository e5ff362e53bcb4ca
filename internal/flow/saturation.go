package flow

import (
	"cmp"
	"errors"
	"math"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// Saturation is the point past which an engine takes no more requests from the queue, judged
// relative to each engine's own capacity from what it reports, corrected for what this gateway
// sent it since the report.
type Saturation struct {
	// MaxWaiting is how many requests an engine may hold waiting (past its running batch) and
	// still take more: the queue dispatches to it while its estimated waiting requests are
	// below this. Positive: that many at every engine; negative: none at any. Zero (the
	// default): none at an engine that states its running batch (Signals.SlotsStated), and
	// LearnWaiting at one that does not. A request waiting at an engine waits there in arrival
	// order, behind every other one sent before it, where at the gateway fair share and
	// priority would order it: a quiet tenant's request dispatched behind two waiting ones
	// waits for three slots to free instead of one. Waiting at the engine only hides the time
	// between a slot freeing and the gateway knowing it, and a replica knows at once when its
	// own requests finish (another replica's, at the engine's next report; with several
	// replicas and no replica sync, a positive value keeps engines busy across that).
	MaxWaiting float64
	// MaxKVUsage is the KV-cache usage, in [0,1], at and above which an engine takes no more.
	// Default 0.8: past it an engine that admits more preempts running requests to make room,
	// and their prefill is done again.
	MaxKVUsage float64
	// MaxPredictedWait is the predicted wait before a new request's prefill starts at and above
	// which an engine takes no more (its own queued prefill, Engine.Judge: the routing cost's Q
	// and S over μ, without its decode-side term, which is no wait); where the engines report no
	// queued prefill, the pool takes no more when the routing cost predicts it on the best
	// engine. Default 1s: one load-monitor
	// interval at its default. An engine needs only enough queued prefill to stay busy until the
	// replica can send it more, which the replica's estimate lets it do the moment the engine
	// drains below the bound, and the estimate is set right at every report; a request queued
	// past that at an engine waits there in arrival order, where at the gateway priority and fair
	// share would order it. Set it to --load-monitor-interval when that changes.
	MaxPredictedWait time.Duration
	// Estimate holds the constants of each engine's estimate (loadmon.Estimate): the prefill
	// rate it is taken to run at until its reports measure one, which turns its queued prefill
	// into a predicted wait, and the bytes-to-tokens rule of a request's cost. The gateway and
	// the fleet simulator set it from the routing cost's (policy.CostConfig.Estimate:
	// --prefill-rate, --bytes-per-token), so that both read one picture of each engine.
	Estimate loadmon.EstimateConfig
	// DefaultSlots is the running batch an engine is taken to hold until it states one (its
	// reports' max_running_requests) or a report shows it full (requests waiting), from which
	// on its reported running count is its capacity; it also bounds the in-flight requests of
	// an engine without a fresh report. Default 256 (SGLang's and vLLM's usual running-request
	// cap).
	DefaultSlots int64
}

// LearnWaiting is the requests an engine that does not state its running batch may hold
// waiting past it under the default MaxWaiting: its batch is learned only from a report that
// shows requests waiting (loadmon.Estimate.Slots), so it must be let hold some.
const LearnWaiting = 2

// DefaultSaturation returns the defaults.
func DefaultSaturation() Saturation {
	return Saturation{MaxKVUsage: 0.8, MaxPredictedWait: time.Second, Estimate: loadmon.DefaultEstimateConfig(), DefaultSlots: 256}
}

// WithDefaults returns s with its zero fields at their defaults (a zero MaxWaiting is its
// default, which depends on the engine).
func (s Saturation) WithDefaults() Saturation {
	d := DefaultSaturation()
	s.MaxKVUsage = cmp.Or(s.MaxKVUsage, d.MaxKVUsage)
	s.MaxPredictedWait = cmp.Or(s.MaxPredictedWait, d.MaxPredictedWait)
	s.DefaultSlots = cmp.Or(s.DefaultSlots, d.DefaultSlots)
	s.Estimate = s.Estimate.WithDefaults()
	return s
}

// Validate reports an invalid field of s, after defaults.
func (s Saturation) Validate() error {
	s = s.WithDefaults()
	switch {
	case math.IsNaN(s.MaxWaiting) || math.IsInf(s.MaxWaiting, 0):
		return errors.New("flow: the saturation's waiting requests must be finite")
	case !(s.MaxKVUsage > 0 && s.MaxKVUsage <= 1):
		return errors.New("flow: the saturation's KV usage must be in (0, 1]")
	case s.MaxPredictedWait < 0:
		return errors.New("flow: the saturation's predicted wait must not be negative")
	case s.Estimate.Validate() != nil:
		return errors.New("flow: the saturation's estimate: " + s.Estimate.Validate().Error())
	case s.DefaultSlots < 1:
		return errors.New("flow: the saturation's default slots must be at least 1")
	}
	return nil
}

// Signals is what the gateway knows of one engine when it judges it.
type Signals struct {
	// Available is the worker's Available(): healthy, breaker closed, not draining.
	Available bool
	// HasReport is true when the engine has a fresh load report.
	HasReport bool
	// Running and Waiting are the requests the report counted.
	Running, Waiting int64
	// SentSince is the requests sent the engine since the report less those that finished
	// (negative when more finished), as the engine's estimate counts them
	// (loadmon.Estimate.Requests).
	SentSince float64
	// KVUsage is the KV-cache usage in [0,1]: the report's, corrected by the sends and finishes
	// since (loadmon.Estimate.KVUsage).
	KVUsage float64
	// Inflight is this gateway's in-flight count for the engine.
	Inflight int64
	// Slots is the engine's running batch (loadmon.Estimate.Slots); 0 means unknown.
	// SlotsStated is true when the engine stated it (loadmon.Estimate.SlotsStated), rather
	// than a report showing it full.
	Slots       int64
	SlotsStated bool
	// PredictedWait is the predicted wait, in seconds, before a new request's prefill starts on
	// this engine (loadmon.Estimate.Wait: its queued prefill and what was sent since, over its
	// prefill rate); meaningful only when HasWait.
	PredictedWait float64
	HasWait       bool
}

// capacity is how many requests the engine holds before it saturates.
func (s Saturation) capacity(sig *Signals) float64 {
	slots := sig.Slots
	if slots <= 0 {
		slots = s.DefaultSlots
	}
	return float64(slots) + s.waiting(sig)
}

// waiting is how many requests the engine may hold waiting past its batch (MaxWaiting).
func (s Saturation) waiting(sig *Signals) float64 {
	switch {
	case s.MaxWaiting > 0:
		return s.MaxWaiting
	case s.MaxWaiting < 0 || sig.SlotsStated:
		return 0
	}
	return LearnWaiting
}

// load is the engine's requests now as far as the gateway can tell.
func load(sig *Signals) float64 {
	if !sig.HasReport {
		return float64(sig.Inflight)
	}
	return max(float64(sig.Running+sig.Waiting)+sig.SentSince, float64(sig.Inflight), 0)
}

// Headroom returns how many more requests the engine takes before it saturates; 0 when it is
// unavailable, saturated, its KV cache is at MaxKVUsage, or its predicted wait at
// MaxPredictedWait.
func (s Saturation) Headroom(sig Signals) float64 {
	if !sig.Available || (sig.HasReport && sig.KVUsage >= s.MaxKVUsage) ||
		(sig.HasWait && sig.PredictedWait >= s.MaxPredictedWait.Seconds()) {
		return 0
	}
	return max(0, math.Floor(s.capacity(&sig)-load(&sig)))
}

// CanStart reports whether the engine can start a request without queueing it: available,
// under MaxKVUsage, and holding fewer than its running batch plus the requests MaxWaiting lets
// it hold waiting. It leaves the
// predicted wait out: a request dispatched from the queue picks among the engines that can
// start it, and the routing cost weighs queued prefill against the cache the request finds
// (a prompt-less wait at the bound already holds the queue).
func (s Saturation) CanStart(sig Signals) bool {
	sig.HasWait = false
	return s.Headroom(sig) >= 1
}

// Drain returns how long until the engine drains below MaxPredictedWait, when its predicted
// wait is all that keeps it from taking more (ok false otherwise): its prefill drains without an
// event, so the caller must wake itself then.
func (s Saturation) Drain(sig Signals) (d time.Duration, ok bool) {
	bound := s.MaxPredictedWait.Seconds()
	if !sig.HasWait || sig.PredictedWait < bound {
		return 0, false
	}
	over := sig.PredictedWait - bound
	sig.HasWait = false
	if s.Headroom(sig) < 1 {
		return 0, false
	}
	return min(time.Duration(over*float64(time.Second)), time.Hour) + time.Millisecond, true
}

// Level returns the engine's saturation in [0,1]: the larger of its requests against its
// capacity and its KV usage against MaxKVUsage; 1 when it is unavailable.
func (s Saturation) Level(sig Signals) float64 {
	if !sig.Available {
		return 1
	}
	l := load(&sig) / s.capacity(&sig)
	if sig.HasReport {
		l = max(l, sig.KVUsage/s.MaxKVUsage)
	}
	if sig.HasWait {
		l = max(l, s.WaitLevel(sig.PredictedWait))
	}
	return min(max(l, 0), 1)
}

// WaitLevel returns the saturation a predicted wait (seconds) stands for: wait ÷ MaxPredictedWait,
// in [0,1].
func (s Saturation) WaitLevel(wait float64) float64 {
	if s.MaxPredictedWait <= 0 {
		return 0
	}
	return min(max(wait/s.MaxPredictedWait.Seconds(), 0), 1)
}

// Judge fills sig's report terms from e, the engine's estimate, moved on to its fresh report r as
// of now; sig.Available and sig.Inflight are the caller's.
func (s *Saturation) Judge(sig *Signals, e *loadmon.Estimate, r *loadmon.Report, now time.Time) {
	e.Observe(r.PolledAt, float64(r.WaitingUncachedTokens), r.Running, r.Waiting, r.Busy(), &s.Estimate)
	e.ObserveBatch(r.MaxRunning)
	sig.HasReport, sig.Running, sig.Waiting = true, r.Running, r.Waiting
	sig.SentSince = e.Requests(r, sig.Inflight) - float64(r.Backlog())
	sig.Slots, sig.SlotsStated, sig.KVUsage = e.Slots(), e.SlotsStated(), e.KVUsage(r)
	if r.HasUncachedTokens {
		sig.PredictedWait, sig.HasWait = e.Wait(now, r.Replicas, &s.Estimate), true
	}
}
