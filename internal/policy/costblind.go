package policy

import "time"

// The blind term: what the peers decided in the last BlindWindow, which cannot have reached
// this replica yet. With the replica sync plane active, S and the requests at an engine count
// what every peer sent it, but only once the peer's batch has arrived; decisions the replicas
// make within one bus delay of each other are blind to one another. Every replica decides on
// the same picture (the engines' reports and the plane's views), so a peer deciding blind
// picks as this replica did: when this replica has itself just sent a worker requests (a
// burst: several arrived within the window), each live peer has probably sent it as many.
//
//	S_w   += n × (this replica's uncached tokens sent w within the last BlindWindow)
//	req_w += n × (this replica's requests sent w within it)
//
// with n the live peers (Peers.Peers). Outside a burst a replica's own last send to a worker
// is older than the window (a millisecond or two against requests tens of milliseconds apart
// per replica) and the term is 0; inside one, the replicas' later decisions of the burst spread
// off the engine their first ones all chose. The first decision of a burst on each replica
// sees nothing of it: no replica can know of a burst before its second request.

// blind adds to c's peers' sends (c.peerTok, c.peerReq) what its live peers probably sent it
// blind, as of now; the caller holds s.mu.
func (s *scorer) blind(c *costCand, now time.Time) {
	if c.peerN <= 0 || s.cfg.BlindWindow <= 0 {
		return
	}
	from := now.Add(-time.Duration(s.cfg.BlindWindow * float64(time.Second)))
	if c.r.polled.After(from) {
		from = c.r.polled // sends before the report are in it
	}
	req, tok := c.st.herd.within(from)
	if req == 0 {
		return
	}
	n := float64(c.peerN)
	c.peerTok += n * tok
	c.peerReq += n * float64(req)
	c.t.Blind = n * tok
}

// blindTies sets c.blindEps: how much the peers' blind decisions of a burst would add to the
// wait at whichever engine every replica finds cheapest, in seconds, by which the tie window of
// a decision widens so that a burst's first decisions on each replica spread by their prompts'
// placement keys instead of all taking that engine. A request of this replica has about
// 2 × burst of its own decisions within the window around it, and each live peer as many; each
// adds about ū uncached tokens at μ tokens/s. The caller holds s.mu.
func (s *scorer) blindTies(c *costCand) {
	c.blindEps = 0
	if c.peerN <= 0 || s.cfg.BlindWindow <= 0 || !(c.t.Rate > 0) {
		return
	}
	c.blindEps = float64(c.peerN) * 2 * s.burst.mean * s.meanUncached / c.t.Rate
}

// blindRing is how many of its own latest decisions a replica keeps for burstRate.
const blindRing = 32

// burstRate measures how bursty this replica's decisions are: the moving average, over its
// decisions, of its own other decisions within BlindWindow before each.
type burstRate struct {
	at   [blindRing]time.Time
	next int
	mean float64
}

// add records a decision at now and folds its count of earlier ones within window (seconds)
// into the mean over about n decisions.
func (b *burstRate) add(now time.Time, window, n float64) {
	from := now.Add(-time.Duration(window * float64(time.Second)))
	k := 0
	for i := range b.at {
		if b.at[i].After(from) {
			k++
		}
	}
	b.at[b.next] = now
	b.next = (b.next + 1) % blindRing
	b.mean += (float64(k) - b.mean) / n
}
