package policy

import (
	"sync"
	"time"
)

// peerScratch holds the buffers of one decision's calls into Peers (slices passed through an
// interface escape, so they are pooled rather than on the stack).
type peerScratch struct {
	ids   []string
	since []time.Time
	tok   []float64
	req   []float64
	at    []int
	out   []int
}

var peerPool = sync.Pool{New: func() any { return new(peerScratch) }}

// peerSent fills peerTok and peerReq of every fresh candidate from peers (one lock of the sync
// plane for all), and sets its replica estimate to 1: the peers' sends are counted, not
// estimated (no replica scaling, no owner credit).
func peerSent(peers Peers, av []costCand) {
	sc := peerPool.Get().(*peerScratch)
	defer peerPool.Put(sc)
	sc.ids, sc.since, sc.at = sc.ids[:0], sc.since[:0], sc.at[:0]
	for i := range av {
		if c := &av[i]; c.fresh {
			sc.ids, sc.since, sc.at = append(sc.ids, c.w.ID), append(sc.since, c.r.polled), append(sc.at, i)
		}
	}
	sc.tok, sc.req = sized(sc.tok, len(sc.ids)), sized(sc.req, len(sc.ids))
	peers.SentSinceAll(sc.ids, sc.since, sc.tok, sc.req)
	n := peers.Peers()
	for j, i := range sc.at {
		c := &av[i]
		c.peerTok, c.peerReq, c.r.replicas, c.peerN = sc.tok[j], sc.req[j], 1, n
	}
	clear(sc.ids) // hold no id
}

// Peers is the cost's narrow hook into the replica sync plane (package replicasync implements
// it): what the other gateway replicas sent and placed, and where this replica tells them its
// own decisions. With Peers nil, or not Active, the cost estimates the others as it always did
// (this replica's sends times the report's replica estimate, the rendezvous owner's credit);
// while Active it counts them instead:
//
//	S_w = own sends since the report + SentSince(w, report time)   (no replica scaling)
//	Ĉ_w = max(own tree's prefix, Placed's prefix)                   (no owner credit)
//
// The engine estimate that owns S may call SentSince itself once it exists; the contract is
// only these five methods.
type Peers interface {
	// Active reports whether the peers' views are current (the bus is up).
	Active() bool
	// Peers returns how many peers are live (heard from recently): the replicas besides this
	// one whose decisions the blind term mirrors (costblind.go).
	Peers() int
	// SentSinceAll writes to tokens[i] and requests[i] what peers sent workers[i] since
	// since[i] (this replica's clock, at receipt): the uncached tokens, and the requests (their
	// sends less their finishes). The slices are equally long.
	SentSinceAll(workers []string, since []time.Time, tokens, requests []float64)
	// Chain appends to dst the sync plane's chain of hashes of text's chunks and returns it
	// with the hash of the whole text: computed once per decision (Request keeps it) for both
	// PlacedChain and DecidedChain.
	Chain(dst []uint64, text string) (bounds []uint64, whole uint64)
	// PlacedChain writes to out[i] the bytes of the leading prefix of a text of textLen bytes
	// (hashed by Chain into bounds and whole) that a peer placed on workers[i] for model
	// (textLen: this very text), 0 where none did.
	PlacedChain(model string, bounds []uint64, whole uint64, textLen int, workers []string, out []int)
	// DecidedChain tells the peers that this replica sent worker model's prompt with the
	// routing text Chain hashed into bounds and whole, uncached tokens of it missing the
	// worker's cache (reqID may be "").
	DecidedChain(model, worker string, bounds []uint64, whole uint64, reqID string, uncached float64)
}

// peerChainInline is how many chunk hashes a Request holds without allocating: those of the
// gateway's default 8 KiB routing text (256-byte chunks); a longer text's spill to the heap.
const peerChainInline = 32

// peerChain is a decision's routing text as the sync plane hashes it (Peers.Chain), kept in
// its Request so that the placement lookup and the publish hash the text once between them.
type peerChain struct {
	text   string // the text hashed (the chain is stale when Request.Text differs)
	done   bool
	n      int // the chain's length in inline, when spill is nil
	inline [peerChainInline]uint64
	spill  []uint64
	whole  uint64
}

// chain returns the chain of req.Text, hashing it on the decision's first call.
func (req *Request) chain(peers Peers) ([]uint64, uint64) {
	c := &req.peers
	if !c.done || c.text != req.Text {
		b, whole := peers.Chain(c.inline[:0], req.Text)
		c.text, c.done, c.whole, c.n, c.spill = req.Text, true, whole, len(b), nil
		if len(b) > 0 && &b[0] != &c.inline[0] {
			c.spill = b // longer than inline: appended elsewhere
		}
	}
	if c.spill != nil {
		return c.spill, c.whole
	}
	return c.inline[:c.n], c.whole
}

// peerDecided publishes this replica's decision to send req to worker, uncached tokens of it
// missing the worker's cache.
func peerDecided(peers Peers, req *Request, worker string, uncached float64) {
	bounds, whole := req.chain(peers)
	peers.DecidedChain(req.Model, worker, bounds, whole, req.ID, uncached)
}

// peerPlaced raises Ĉ of every candidate (in characters of the tree's match, m.Total of them in
// the text, before the conversion to tokens) to what a peer placed there.
func peerPlaced(peers Peers, av []costCand, req *Request, total int) {
	sc := peerPool.Get().(*peerScratch)
	defer peerPool.Put(sc)
	ids := sc.ids[:0]
	for i := range av {
		ids = append(ids, av[i].w.ID)
	}
	sc.ids, sc.out = ids, sized(sc.out, len(av))
	out := sc.out
	bounds, whole := req.chain(peers)
	peers.PlacedChain(req.Model, bounds, whole, len(req.Text), ids, out)
	defer clear(ids)
	for i := range av {
		c := out[i]
		switch {
		case c <= 0:
			continue
		case c >= len(req.Text):
			c = total // all of it, in the tree's characters
		case total != len(req.Text):
			c = c * total / len(req.Text) // bytes into characters, near enough
		}
		av[i].t.Cached = max(av[i].t.Cached, float64(c))
	}
}

// OwnSent returns the uncached tokens this replica sent the worker with id since its last
// report (unscaled: S's own part before the replica estimate, less what the engine prefilled
// past its queue since), 0 for a worker it never sent to. It is what /get_loads shows beside the peers' part.
func (p *Cost) OwnSent(id string) float64 {
	p.sc.mu.Lock()
	defer p.sc.mu.Unlock()
	if st := p.sc.ws[id]; st != nil {
		_, own := st.est.Prefill(p.sc.now(), 1, &p.sc.est)
		return own
	}
	return 0
}

// SessionShare is implemented by a Peers that also shares sticky-session bindings
// (replicasync.Node): a session whose earlier turns reached another replica keeps its worker
// through this one.
type SessionShare interface {
	// BindSession tells the peers that session key is bound to worker.
	BindSession(key, worker string)
	// SessionWorker returns the worker a peer bound session key to.
	SessionWorker(key string) (worker string, ok bool)
}
