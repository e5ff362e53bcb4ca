package replicasync

import (
	"errors"
	"time"
)

// Outcomes of Apply, besides nil (applied).
var (
	ErrSelf      = errors.New("replicasync: own batch")
	ErrDuplicate = errors.New("replicasync: duplicate batch")
	ErrBanned    = errors.New("replicasync: peer banned")
	ErrOverRate  = errors.New("replicasync: peer over its rate")
	ErrOverPeers = errors.New("replicasync: too many peers")
)

// Apply applies one batch a peer published: all of it, or nothing when it is malformed (the
// peer is then banned for BanFor), a duplicate, from this Node itself, or over the peer's
// bounds. The error says which; each is counted in Stats.
func (n *Node) Apply(msg []byte) error {
	rd, h, err := NewReader(msg)
	if err != nil {
		n.stats.Malformed.Add(1)
		return err
	}
	if h.Sender == n.id {
		return ErrSelf
	}
	// Decode it whole before anything is applied: a batch is applied all or nothing.
	var r Record
	count := 0
	for {
		ok, err := rd.Next(&r)
		if err != nil {
			n.stats.Malformed.Add(1)
			n.ban(h.Sender)
			return err
		}
		if !ok {
			break
		}
		count++
	}
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	p, err := n.admit(h, now, count, len(msg))
	if err != nil {
		return err
	}
	if h.Seq > p.lastSeq+1 && p.lastSeq > 0 {
		n.stats.Gaps.Add(h.Seq - p.lastSeq - 1)
	}
	p.lastSeq, p.heard = h.Seq, now
	rd, _, _ = NewReader(msg)
	at := now.UnixNano()
	for {
		ok, _ := rd.Next(&r)
		if !ok {
			break
		}
		n.applyRecord(&r, at)
	}
	n.stats.Applied.Add(1)
	n.stats.Records.Add(uint64(count))
	n.heardPeer.Store(true)
	if n.applied != nil {
		n.applied()
	}
	return nil
}

// admit finds (or admits) the batch's peer and checks its bounds; n.mu is held.
func (n *Node) admit(h Header, now time.Time, records, bytes int) (*peer, error) {
	p := n.peers[h.Sender]
	if p == nil {
		if len(n.peers) >= n.cfg.MaxPeers {
			n.expirePeers(now)
		}
		if len(n.peers) >= n.cfg.MaxPeers {
			n.stats.OverPeers.Add(1)
			return nil, ErrOverPeers
		}
		p = &peer{recTokens: n.cfg.PeerRecords, byteTokens: n.cfg.PeerBytes, refilled: now}
		n.peers[h.Sender] = p
	}
	if now.Before(p.bannedUntil) {
		n.stats.Banned.Add(1)
		return nil, ErrBanned
	}
	if h.Seq <= p.lastSeq {
		n.stats.Duplicate.Add(1)
		return nil, ErrDuplicate
	}
	if dt := now.Sub(p.refilled).Seconds(); dt > 0 {
		p.recTokens = min(p.recTokens+dt*n.cfg.PeerRecords, n.cfg.PeerRecords)
		p.byteTokens = min(p.byteTokens+dt*n.cfg.PeerBytes, n.cfg.PeerBytes)
		p.refilled = now
	}
	if p.recTokens < float64(records) || p.byteTokens < float64(bytes) {
		// The batch is lost to this replica: the sequence moves on, so the next batch is no gap.
		p.lastSeq = h.Seq
		n.stats.OverRate.Add(1)
		return nil, ErrOverRate
	}
	p.recTokens -= float64(records)
	p.byteTokens -= float64(bytes)
	return p, nil
}

// ban ignores sender for BanFor.
func (n *Node) ban(sender uint64) {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[sender]
	if p == nil {
		if len(n.peers) >= n.cfg.MaxPeers {
			n.expirePeers(now)
		}
		if len(n.peers) >= n.cfg.MaxPeers {
			return
		}
		p = &peer{}
		n.peers[sender] = p
	}
	p.bannedUntil, p.heard = now.Add(n.cfg.BanFor), now
}

// expirePeers forgets peers unheard for PeerTimeout and not banned; n.mu is held.
func (n *Node) expirePeers(now time.Time) {
	for id, p := range n.peers {
		if now.Sub(p.heard) > n.cfg.PeerTimeout && !now.Before(p.bannedUntil) {
			delete(n.peers, id)
		}
	}
}

// Peers returns the peers heard within PeerTimeout (banned ones not counted).
func (n *Node) Peers() int {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, p := range n.peers {
		if now.Sub(p.heard) <= n.cfg.PeerTimeout && !now.Before(p.bannedUntil) {
			k++
		}
	}
	return k
}

// Lag returns the age of the least recently heard live peer's last batch, 0 without peers: a
// peer's clock is not trusted, so this is measured at receipt.
func (n *Node) Lag() time.Duration {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var lag time.Duration
	for _, p := range n.peers {
		if age := now.Sub(p.heard); age <= n.cfg.PeerTimeout && !now.Before(p.bannedUntil) {
			lag = max(lag, age)
		}
	}
	return lag
}

// applyRecord applies one decoded record received at (Unix ns); n.mu is held.
func (n *Node) applyRecord(r *Record, at int64) {
	w, ok := n.worker(r.Worker, at)
	if !ok {
		n.stats.OverWorkers.Add(1)
		return
	}
	switch r.Kind {
	case KindDecision:
		n.logs[w].send(at, float64(r.Uncached), n.cfg.Window)
		if k := r.Hashes(); k > 0 {
			pl := n.placementOf(r.Model)
			if pl == nil {
				return
			}
			for i := range k {
				n.gen++
				pl.insert(r.Hash(i), w, n.gen)
			}
		}
	case KindFinish:
		n.logs[w].finish(at, n.cfg.Window)
	case KindAffinity:
		n.affinity[r.NS].put(r.Key, w, n.logs[w].born, at, n.cfg.MaxAffinity)
	}
}

// worker returns the index of worker id b, tracking it on first sight (recycling the least
// recently heard past MaxWorkers); n.mu is held.
func (n *Node) worker(b []byte, at int64) (uint16, bool) {
	if i, ok := n.workers[string(b)]; ok {
		n.logs[i].heard = at
		return i, true
	}
	if len(n.logs) < n.cfg.MaxWorkers {
		i := uint16(len(n.logs))
		n.logs = append(n.logs, &workerLog{id: string(b), heard: at, born: n.gen + 1})
		n.workers[string(b)] = i
		return i, true
	}
	old := 0
	for i, l := range n.logs {
		if l.heard < n.logs[old].heard {
			old = i
		}
	}
	if n.logs[old].heard == at {
		return 0, false // everyone was heard just now: a flood of worker ids
	}
	delete(n.workers, n.logs[old].id)
	*n.logs[old] = workerLog{id: string(b), heard: at, born: n.gen + 1}
	n.workers[string(b)] = uint16(old)
	return uint16(old), true
}

// placementOf returns model's placement view, created on first sight up to MaxModels; n.mu is
// held.
func (n *Node) placementOf(model []byte) *placement {
	if pl := n.models[string(model)]; pl != nil {
		return pl
	}
	if len(n.models) >= n.cfg.MaxModels {
		return nil
	}
	pl := newPlacement(n.cfg.MaxPlacements)
	n.models[string(model)] = pl
	return pl
}
