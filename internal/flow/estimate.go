package flow

import (
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// Engine is one replica's picture of one engine between the engine's load reports: the last
// report, corrected by what this replica sent the engine and saw finish since, so that the
// saturation judgement is as current as the replica's own traffic rather than as old as the
// last poll. A report is up to a poll interval old; in that time an engine near saturation
// finishes requests (freeing KV cache and running slots), prefills what was queued, and takes
// what this replica sent. Without the correction a finish frees nothing until the next poll,
// and a queued request waits for it while the engine has room.
//
// The estimate, from the report r and this replica's sends and finishes since it:
//
//	KV usage       (r.UsedTokens + sent − finished) ÷ r.MaxTokens
//	prefill wait   max(r.WaitingUncachedTokens + sentUncached − μ·age, 0) ÷ μ
//
// sent and finished count each request at its prompt tokens (its estimate at send: the KV it
// takes when admitted, and frees when it ends; the output it generates is left to the next
// report). sentUncached counts the prompt tokens each send was predicted to miss the engine's
// cache. μ is the engine's prefill rate, measured between reports while it was busy throughout
// (Saturation.PrefillRate until then), and age the time since the report. Other replicas' sends
// and finishes show in the next report only. What was sent or finished between the poll and
// the moment this replica saw its report counts against the older report: a few milliseconds'
// traffic on a live gateway, none in the simulator.
//
// The zero value knows nothing. Not safe for concurrent use: the gateway holds its lock around
// it, the simulator is single-threaded.
type Engine struct {
	polled  time.Time
	slots   Slots
	rate    float64 // measured μ, tokens/s; 0 until a second report
	backlog float64 // the last report's queued prefill, tokens
	// sent and freed are the KV tokens of the requests this replica sent the engine, and of
	// those that finished, since the last report; sentUncached the prefill they were
	// predicted to add.
	sent, freed, sentUncached float64
}

// Sent records a request this replica sent the engine: kv prompt tokens, of which uncached
// were predicted to miss its cache.
func (e *Engine) Sent(kv, uncached float64) {
	e.sent += max(kv, 0)
	e.sentUncached += max(uncached, 0)
}

// Finished records the end of a request this replica sent the engine (before or after the
// report), holding the kv tokens Sent was given.
func (e *Engine) Finished(kv float64) { e.freed += max(kv, 0) }

// observe moves the estimate on to r when it is a newer report: it learns the running batch and
// the prefill rate, and restarts the counts since the report.
func (e *Engine) observe(r *loadmon.Report, nominal float64) {
	if !r.PolledAt.After(e.polled) {
		return
	}
	backlog := float64(r.WaitingUncachedTokens)
	if e.rate == 0 {
		e.rate = nominal
	}
	if dt := r.PolledAt.Sub(e.polled).Seconds(); !e.polled.IsZero() && dt > 0 && e.backlog > 0 && backlog > 0 {
		// Busy through the interval: what it prefilled is what it had and was sent, less what
		// it still has. An even blend of the last measure and this one, never below a quarter
		// of the last (a burst of cache hits sent makes one interval look slow).
		measured := (e.backlog + e.sentUncached - backlog) / dt
		e.rate = 0.5*e.rate + 0.5*min(max(measured, e.rate/4), 64*nominal)
	}
	e.polled, e.backlog = r.PolledAt, backlog
	e.slots.Observe(r.Running, r.Waiting)
	e.sent, e.freed, e.sentUncached = 0, 0, 0
}

// Judge fills sig's report terms from the engine's fresh report r as of now, corrected by the
// estimate (see Engine); sig.Available and sig.Inflight are the caller's. nominal is the prefill
// rate, tokens/s, taken until the reports measure one (Saturation.PrefillRate).
func (e *Engine) Judge(sig *Signals, r *loadmon.Report, now time.Time, nominal float64) {
	e.observe(r, nominal)
	sig.HasReport, sig.Running, sig.Waiting = true, r.Running, r.Waiting
	sig.SentSince, sig.Slots = sig.Inflight-r.InflightAtPoll, e.slots.N()
	sig.KVUsage = r.TokenUsage
	if r.MaxTokens > 0 {
		used := float64(r.UsedTokens)
		if used == 0 {
			used = r.TokenUsage * float64(r.MaxTokens)
		}
		sig.KVUsage = min(max((used+e.sent-e.freed)/float64(r.MaxTokens), 0), 1)
	}
	if r.HasUncachedTokens && e.rate > 0 {
		done := e.rate * max(now.Sub(r.PolledAt).Seconds(), 0)
		sig.PredictedWait, sig.HasWait = max(e.backlog+e.sentUncached-done, 0)/e.rate, true
	}
}

// Rate returns the engine's prefill rate as measured, tokens/s; 0 before its first report.
func (e *Engine) Rate() float64 { return e.rate }
