package policy

import (
	"errors"
	"time"
)

// The herd term of the cost, H_w in seconds: what the requests sent to w within its current
// decode step, and not yet in a report of w, add to this request's wait there.
//
//	H_w = HerdShare × n_w × D_w
//
// n_w (requests) is what this replica sent w over the last D_w seconds since w's last report,
// plus what the peers sent it since that report where replica sync is active (their sends less
// their finishes, Peers.SentSinceAll), and D_w (seconds) is one decode step of w's batch (the D
// term). Each such request joins the same step's prefill chunk as this one and lengthens that
// step for the whole batch; the term charges one step per request, so requests decided within
// one step spread over the engines that tie instead of following one placement hash. HerdShare
// is a weight in steps per request; 0 (the default) is the cost without the term.

// herdRing is how many of its own sends to a worker a replica remembers for n_w: a step
// that took more than this many requests counts this many.
const herdRing = 32

// herdSends is a replica's record of its latest sends to one worker, for n_w.
type herdSends struct {
	at   [herdRing]time.Time
	tok  [herdRing]float64 // each send's uncached tokens (costblind.go, coststep.go)
	last time.Time         // the latest send's
	next int
}

// add records a send at t of uncached tokens.
func (h *herdSends) add(t time.Time, uncached float64) {
	h.at[h.next], h.tok[h.next], h.last = t, uncached, t
	h.next = (h.next + 1) % herdRing
}

// within returns the recorded sends after from (exclusive) and their uncached tokens.
func (h *herdSends) within(from time.Time) (requests int, tokens float64) {
	if !h.last.After(from) {
		return 0, 0 // the common case: nothing recent
	}
	for i := range h.at {
		if h.at[i].After(from) {
			requests++
			tokens += h.tok[i]
		}
	}
	return requests, tokens
}

// since counts the recorded sends after from (exclusive).
func (h *herdSends) since(from time.Time) int {
	n := 0
	for i := range h.at {
		if h.at[i].After(from) {
			n++
		}
	}
	return n
}

// herd sets t.Herd of c as of now (D, and c.r, c.peerReq set); the caller holds s.mu.
func (s *scorer) herd(c *costCand, now time.Time) {
	t := &c.t
	t.Herd = 0
	if s.cfg.HerdShare == 0 || t.Decode <= 0 {
		return
	}
	from := now.Add(-time.Duration(t.Decode * float64(time.Second)))
	if c.fresh && c.r.polled.After(from) {
		from = c.r.polled // what the report counts is in D already
	}
	n := float64(c.st.herd.since(from)) + max(c.peerReq, 0)
	t.Herd = s.cfg.HerdShare * n * t.Decode
}

func validHerdShare(v float64) error {
	if !(v >= 0) || v > 100 {
		return errors.New("herd_share must be in [0, 100] decode steps per request")
	}
	return nil
}
