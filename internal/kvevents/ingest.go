package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/kvevents/zmtp"
)

// handle applies one [topic, seq, payload] message received on sock.
func (s *Service) handle(sock *zmtp.Socket, m zmtp.Message) {
	f := m.Frames
	if len(f) != 3 || len(f[1]) != 8 {
		s.malformed.Add(1)
		return
	}
	addr, model, ok := parseTopic(string(f[0]))
	if !ok {
		s.malformed.Add(1)
		return
	}
	s.ingest.Lock()
	defer s.ingest.Unlock()
	t := s.workerFor(sock, m.Peer, addr)
	if t == nil {
		return
	}
	b, err := DecodeLimit(f[2], s.cfg.MaxDecoded)
	if err != nil {
		s.malformed.Add(1)
		return
	}
	src := Source{Worker: t.id, Model: model, Rank: b.Rank}
	s.sequence(t, src, connKey{sock, m.Peer.ID}, via(m.Peer), binary.BigEndian.Uint64(f[1]), &b)
}

// via names a connection for the log: the endpoint dialed, or the publisher's address.
func via(p zmtp.Peer) string {
	if p.Endpoint != "" {
		return p.Endpoint
	}
	return p.Addr.String()
}

// workerFor returns the worker a message speaks for, or nil (counted) when it names none or its
// publisher may not speak for the one it names. The topic's address names the worker; a
// message on a dialed connection whose topic names no registered worker is the dialed worker's
// when only one worker is reached through that endpoint.
func (s *Service) workerFor(sock *zmtp.Socket, p zmtp.Peer, addr string) *tracked {
	s.mu.Lock()
	defer s.mu.Unlock()
	var t *tracked
	if id, ok := s.byAddr[addr]; ok && addr != "" {
		t = s.workers[id]
	}
	var d *dialed
	if sock != s.bind {
		d = s.dialed[p.Endpoint]
	}
	if t == nil && d != nil {
		if len(d.workers) == 1 {
			t = s.workers[d.workers[0]]
		} else {
			s.warnOnce("shared "+d.endpoint, "kv events: dropping events whose topic names none of the workers sharing their endpoint; "+
				"set each engine's topic to kv@<host>:<port>@<model> or give each its own port ("+EndpointLabel+" label)",
				"endpoint", d.endpoint, "workers", strings.Join(d.workers, ","))
		}
	}
	if t == nil {
		s.unknown.Add(1)
		return nil
	}
	if !s.mayPublish(t, p, d) {
		if len(t.addrs) == 0 && t.resolvedAt.IsZero() && !isLocalhost(t.host) {
			// Its host name is still being looked up: no verdict yet, and no warning.
			s.unknown.Add(1)
			return nil
		}
		s.rejected.Add(1)
		s.warnOnce("rejected "+t.id+" "+p.Addr.String(), "kv events: refusing events for a worker from a publisher that is not on its host "+
			"(allow it with the worker label "+PublisherLabel+")", "worker", t.id, "publisher", p.Addr.String())
		return nil
	}
	return t
}

// mayPublish reports whether the publisher at p may speak for t: it is on t's host (a
// connection the gateway dialed to t's own endpoint is), or within t's PublisherLabel.
// Callers hold mu.
func (s *Service) mayPublish(t *tracked, p zmtp.Peer, d *dialed) bool {
	if d != nil && d.endpoint == t.endpoint {
		return true
	}
	a := p.Addr
	if a.IsLoopback() && isLocalhost(t.host) {
		return true
	}
	for _, h := range t.addrs {
		if h == a {
			return true
		}
	}
	for _, pr := range t.allowed {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// sequence checks a decoded batch's sequence number against its stream and applies it. The
// rules, for a stream last at L receiving seq:
//   - L+1, or a stream's first message: in order.
//   - ≤ L on a new connection while the old one is gone, or 0: the publisher restarted; its
//     engine's cache started empty, and batches [0, seq) that did not reach us are a gap.
//   - more than MaxJump away either way: no gap a replay could fill (a poisoned number, or a
//     restart we could not see): the picture is dropped and distrusted for Resync, and the
//     stream goes on from seq, so one bad number can never freeze a stream.
//   - otherwise ≤ L: a duplicate (the same engine reached us twice), dropped.
//   - otherwise: a gap, filled by a replay or resynchronized.
//
// Callers hold ingest.
func (s *Service) sequence(t *tracked, src Source, key connKey, via string, seq uint64, b *Batch) {
	now := s.cfg.Now()
	s.mu.Lock()
	st := s.streams[src]
	if st == nil {
		if s.streamsOf(src.Worker) >= maxSourcesPerWorker {
			// A publisher inventing models or ranks: its new streams are dropped.
			s.mu.Unlock()
			s.unknown.Add(1)
			return
		}
		st = &stream{}
		s.streams[src] = st
	}
	last, started := st.last, st.started
	moved := started && st.conn != key
	oldGone := moved && !s.live[st.conn]
	far := seq > last && seq-last > s.cfg.MaxJump || seq <= last && last-seq > s.cfg.MaxJump
	dup := started && seq <= last && !far && seq != 0 && !oldGone
	if dup {
		s.mu.Unlock()
		return
	}
	st.conn, st.via, st.leftAt, st.back = key, via, time.Time{}, connKey{}
	t.heard = true
	if !t.publishing {
		t.publishing = true
		s.cfg.Logger.Info("kv events: worker's events started", "worker", t.id, "from", via, "model", src.Model, "rank", src.Rank)
	}
	s.mu.Unlock()
	switch {
	case !started || seq == last+1:
	case far:
		s.resyncs.Add(1)
		s.cfg.Logger.Warn("kv events: sequence number jumped too far to be a gap: dropping the worker's cache picture until it is rebuilt",
			"worker", t.id, "from", via, "model", src.Model, "rank", src.Rank, "last", last, "seq", seq)
		s.idx.Reset(src, now.Add(s.cfg.Resync))
	case seq <= last:
		s.restarts.Add(1)
		s.cfg.Logger.Info("kv events: publisher restarted, rebuilding the worker's cache picture",
			"worker", t.id, "from", via, "model", src.Model, "rank", src.Rank, "seq", seq)
		s.idx.Reset(src, time.Time{})
		if seq > 0 {
			s.gaps.Add(1)
			s.fillGap(t, src, st, 0, seq)
		}
	default:
		s.gaps.Add(1)
		s.fillGap(t, src, st, last+1, seq)
	}
	s.mu.Lock()
	st.started, st.last = true, seq
	s.mu.Unlock()
	s.idx.Apply(src, b.Events)
	s.batches.Add(1)
}

// streamsOf counts worker's streams. Callers hold mu.
func (s *Service) streamsOf(worker string) int {
	n := 0
	for src := range s.streams {
		if src.Worker == worker {
			n++
		}
	}
	return n
}

// parseTopic splits kv@<host>:<port>@<model>; a bare topic ("kv") has neither.
func parseTopic(topic string) (addr, model string, ok bool) {
	if len(topic) > 512 {
		return "", "", false
	}
	parts := strings.SplitN(topic, "@", 3)
	switch len(parts) {
	case 1:
		return "", "", true
	case 2:
		return parts[1], "", true
	}
	return parts[1], parts[2], true
}

// fillGap asks the worker's replay socket for batches [from, to) and applies them; when that
// fails, it drops the source's picture and distrusts it for Config.Resync. A stream asks for a
// replay at most once per Resync, so that a publisher making gaps on purpose cannot keep
// ingestion waiting on replays. Callers hold ingest.
func (s *Service) fillGap(t *tracked, src Source, st *stream, from, to uint64) {
	now := s.cfg.Now()
	s.mu.Lock()
	ask := t.replay != "" && (st.replay.IsZero() || now.Sub(st.replay) >= s.cfg.Resync)
	if ask {
		st.replay = now
	}
	s.mu.Unlock()
	if ask && s.replay(t.replay, src, from, to) {
		s.replayed.Add(1)
		return
	}
	s.resyncs.Add(1)
	s.cfg.Logger.Warn("kv events: sequence gap not replayed, dropping the worker's cache picture until it is rebuilt",
		"worker", src.Worker, "model", src.Model, "rank", src.Rank, "missing_from", from, "missing_to", to)
	s.idx.Reset(src, now.Add(s.cfg.Resync))
}

// replay fetches batches [from, to) of src from endpoint and applies each as it arrives; it
// reports whether every one came (when not, the caller drops the picture anyway).
func (s *Service) replay(endpoint string, src Source, from, to uint64) bool {
	if to-from > s.cfg.MaxJump {
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmtp.NewSocket(zmtp.DEALER, zmtp.Options{MaxFrame: s.cfg.MaxFrame, MaxFrames: 4, Budget: s.budget,
		HandshakeTimeout: s.cfg.ReplayTimeout})
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		return false
	}
	if err := d.Send(ctx, [][]byte{nil, seqBytes(from)}); err != nil {
		return false
	}
	next := from
	for {
		m, err := d.RecvMessage(ctx)
		if err != nil {
			return false
		}
		ok, done := s.replayed1(m.Frames, src, &next, to)
		m.Release()
		if done || !ok {
			return ok && next == to
		}
	}
}

// replayed1 handles one replay message: ok false ends the replay as failed, done true as over.
func (s *Service) replayed1(m [][]byte, src Source, next *uint64, to uint64) (ok, done bool) {
	if len(m) != 3 || len(m[1]) != 8 {
		return false, true
	}
	if string(m[1]) == string(endSeq) {
		return true, true
	}
	seq := binary.BigEndian.Uint64(m[1])
	if seq < *next || seq >= to {
		return true, false // before the gap (already applied) or after it (live messages carry it)
	}
	if seq != *next {
		return false, true // the publisher no longer buffers part of the gap
	}
	b, err := DecodeLimit(m[2], s.cfg.MaxDecoded)
	if err != nil || b.Rank != src.Rank {
		return false, true
	}
	s.idx.Apply(src, b.Events)
	s.batches.Add(1)
	*next++
	return true, false
}

// joined records a new connection; a dialed endpoint that reaches one worker makes that
// worker's stream exist before its first event (it holds nothing we know of yet, which lets
// matches answer for it).
func (s *Service) joined(sock *zmtp.Socket, p zmtp.Peer) {
	key := connKey{sock, p.ID}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[key] = true
	d := s.dialed[p.Endpoint]
	if sock == s.bind || d == nil || d.sock != sock || len(d.workers) != 1 {
		return
	}
	t := s.workers[d.workers[0]]
	if t == nil {
		return
	}
	// The publisher is back: its streams wait on this connection rather than age out.
	for src, st := range s.streams {
		if src.Worker == t.id && !st.leftAt.IsZero() {
			st.leftAt, st.back = time.Time{}, key
		}
	}
	src := Source{Worker: t.id}
	if st := s.streams[src]; st == nil {
		s.streams[src] = &stream{conn: key, via: p.Endpoint}
	} else if !st.started {
		st.conn, st.via, st.leftAt = key, p.Endpoint, time.Time{}
	}
	s.idx.Expect(src)
	t.heard = true
	if !t.publishing {
		t.publishing = true
		s.cfg.Logger.Info("kv events: connected to the worker's publisher", "worker", t.id, "endpoint", p.Endpoint)
	}
}

// left records a connection's end: the streams it carried keep their picture for Resync, for
// the publisher to come back (the sweep drops them after that).
func (s *Service) left(sock *zmtp.Socket, p zmtp.Peer) {
	key := connKey{sock, p.ID}
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.live, key)
	for src, st := range s.streams {
		if st.conn != key && st.back != key {
			continue
		}
		st.leftAt = now
		if t := s.workers[src.Worker]; t != nil && t.publishing {
			t.publishing = false
			s.cfg.Logger.Warn("kv events: worker's publisher disconnected; its cache picture is kept while it may come back",
				"worker", t.id, "from", via(p), "keep", s.cfg.Resync)
		}
	}
}

// isLocalhost reports whether host names this machine.
func isLocalhost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
