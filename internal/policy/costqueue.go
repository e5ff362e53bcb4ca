package policy

import "time"

// The queued-sends term of the cost, U_w in tokens: the prefill of this replica's sends to w
// since w's last report that the engine cannot have done yet, because it cannot prefill a prompt
// before the prompt reaches it.
//
//	U_w = max(b_w(now) − Q_w, 0),   b ← max(b − μ_w × (t_i − t_{i−1}), 0) + u_i for each send i at t_i,
//	S_w = max(S_w, U_w)
//
// b_w (tokens) is the engine's prefill queue as this replica's sends make it: it starts at the
// report's Q_w at the instant of the report, takes each send's uncached tokens u_i at the instant
// it was sent, and drains at μ_w only while it holds work (a work-conserving queue). S alone takes
// off everything the engine could have prefilled since the report past Q, μ_w × its age − Q_w,
// whether or not the work had come: on an engine that had nothing queued at a report a second old,
// a prompt sent now is taken as prefilled already, 8,000 tokens of it at the default μ, and the
// next request sees the engine as idle. A decode-bound fleet (every prompt a few hundred tokens,
// every engine's queue empty at each report) then sends the requests that arrive together to the
// engine its other terms favour, several within one decode step (shared-prefix at 300/s, one
// gateway: TTFT p99 222 ms, 121 ms with U; docs/routing.md §8.5). With replica sync the peers'
// sends join b at the instant this replica hears of them. CostConfig.QueueSends turns it on; off,
// the cost is §8's.

// sendQueue is b_w: this replica's picture of w's prefill queue since w's report polled at
// polled, as of the last send.
type sendQueue struct {
	polled time.Time // the report it starts from; zero: no send since any report
	at     time.Time // the instant of the last send (the report's, before one)
	tokens float64   // the queue just after it, in tokens
	peers  float64   // the peers' sends since the report it has taken, in tokens
}

// backlog returns b at now, the queue drained at rate tokens a second since the last send.
func (q *sendQueue) backlog(now time.Time, rate float64) float64 {
	return max(q.tokens-rate*max(now.Sub(q.at).Seconds(), 0), 0)
}

// add takes tokens sent at now into the queue, drained at rate since the last send.
func (q *sendQueue) add(now time.Time, rate, tokens float64) {
	q.tokens, q.at = q.backlog(now, rate)+tokens, now
}

// since makes q the queue of the report c was read from, started at its Q, unless it is already;
// false when the estimate does not follow that report (no Q to start from).
func (s *scorer) since(q *sendQueue, st *workerCost, c *costCand) bool {
	if q.polled.Equal(c.r.polled) {
		return true
	}
	if !st.est.Follows(c.r.polled) {
		return false
	}
	q0, _ := st.est.Prefill(c.r.polled, 1, &s.est) // Q at the instant of the report
	*q = sendQueue{polled: c.r.polled, at: c.r.polled, tokens: q0}
	return true
}

// queueSent adds a send of uncached tokens, now, to the queue of c's worker (st its state); the
// caller holds s.mu.
func (s *scorer) queueSent(st *workerCost, c *costCand, uncached float64) {
	if s.cfg.QueueSends && c.fresh && s.since(&st.queue, st, c) {
		st.queue.add(s.now(), c.t.Rate, uncached)
	}
}

// queuedSends sets U of c (t.Unprefilled) as of now and raises S to it (Q, S, μ and, with
// replica sync, the peers' sends set); the caller holds s.mu. What the peers sent since the
// report joins the queue when this replica hears of it, at the first decision or price that reads
// it (the blind term's guess of what it has not heard yet does not join): a price asked more often
// only hears it closer to when it was sent.
func (s *scorer) queuedSends(c *costCand, now time.Time) {
	t := &c.t
	t.Unprefilled = 0
	if !s.cfg.QueueSends || !c.fresh {
		return
	}
	q := &c.st.queue
	heard := c.peerTok - t.Blind
	if !q.polled.Equal(c.r.polled) && (heard <= 0 || !s.since(q, c.st, c)) {
		return // nothing sent since this report
	}
	if heard > q.peers {
		q.add(now, t.Rate, heard-q.peers)
		q.peers = heard
	}
	t.Unprefilled = max(q.backlog(now, t.Rate)-t.Queued, 0)
	t.Sent = max(t.Sent, t.Unprefilled)
}
