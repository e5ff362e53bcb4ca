package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/kvevents/zmtp"
	"github.com/kvgate/kvgate/internal/worker"
)

// Worker labels that point the gateway at one worker's event sockets (admin API or
// --worker-label); they override Config.Port and Config.ReplayPort for that worker.
const (
	// EndpointLabel is the worker's PUB endpoint, tcp://host:port; the gateway dials it.
	EndpointLabel = "kv_events_endpoint"
	// ReplayLabel is the worker's replay ROUTER endpoint, tcp://host:port.
	ReplayLabel = "kv_events_replay_endpoint"
)

// Config configures event ingestion. The zero value ingests nothing.
type Config struct {
	// Bind is a SUB endpoint engines dial ("tcp://0.0.0.0:5557"), "" for none. Anything that
	// can reach it can publish, so bind it to the engines' network only; what it accepts is
	// bounded (MaxFrame, the per-worker index bound) and topics naming no registered worker
	// are dropped.
	Bind string
	// Port, when not 0, makes the gateway dial every worker's publisher at tcp://<worker
	// host>:Port (vLLM binds tcp://*:5557 by default).
	Port int
	// ReplayPort, when not 0, is every worker's replay port, asked after a sequence gap.
	ReplayPort int
	// MaxBlocks bounds the blocks kept per worker, over all its event streams (models and
	// data-parallel ranks); past it the fullest stream's oldest go first. A block costs at most
	// BytesPerBlock bytes, so a worker costs at most MaxBlocks × BytesPerBlock. Default 1<<18
	// (4 M tokens of 16-token blocks, more than one GPU's KV cache holds; at most 40 MiB).
	MaxBlocks int
	// MaxFrame bounds one message frame in bytes. Default 8 MiB.
	MaxFrame int
	// ReplayTimeout bounds one replay request. Default 2 s.
	ReplayTimeout time.Duration
	// Resync is how long a worker's picture is distrusted after it was dropped for a gap that
	// no replay filled: the prefix tree routes its model until fresh events rebuilt it. Default
	// 10 s.
	Resync time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives state changes; nil discards them.
	Logger *slog.Logger

	// AfterMessage, when set, is called after each received message is handled, applied or
	// not; tests wait on it.
	AfterMessage func()
}

// Enabled reports whether c ingests anything.
func (c Config) Enabled() bool { return c.Bind != "" || c.Port != 0 }

func (c Config) withDefaults() Config {
	if c.MaxBlocks <= 0 {
		c.MaxBlocks = 1 << 18
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = 8 << 20
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// maxSourcesPerWorker bounds the event streams one worker may have (models × data-parallel
// ranks), so a publisher inventing topics cannot grow the index.
const maxSourcesPerWorker = 64

// Stats counts what ingestion saw.
type Stats struct {
	// Batches applied; Malformed messages dropped (bad framing, topic or payload); Unknown
	// messages whose topic names no registered worker.
	Batches, Malformed, Unknown uint64
	// Gaps seen; Replayed gaps filled by a replay; Resyncs: gaps that dropped a worker's
	// picture; Restarts: publishers seen starting over from sequence 0.
	Gaps, Replayed, Resyncs, Restarts uint64
	// Dropped messages at a full socket queue (each makes a gap).
	Dropped uint64
	Index   IndexStats
}

// Service ingests KV-cache events from every worker into one Index. Create it with New, follow
// the registry with Track and Forget, stop it with Close.
type Service struct {
	cfg Config
	idx *Index

	bind     *zmtp.Socket
	BindAddr string // the bound SUB address, "" when not bound

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[string]*tracked // by worker id
	byAddr  map[string]string   // host:port of a worker URL → worker id
	streams map[Source]*stream

	batches, malformed, unknown       atomic.Uint64
	gaps, replayed, resyncs, restarts atomic.Uint64
}

// tracked is one registered worker.
type tracked struct {
	id     string
	replay string // replay endpoint, "" for none
	sock   *zmtp.Socket
}

// stream is the sequence state of one source; mu serializes its messages.
type stream struct {
	mu      sync.Mutex
	last    uint64
	started bool
}

// New starts ingestion: it binds cfg.Bind when set. Workers are dialed as Track registers them.
func New(cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, idx: NewIndex(cfg.MaxBlocks, maxSourcesPerWorker), ctx: ctx, cancel: cancel,
		workers: map[string]*tracked{}, byAddr: map[string]string{}, streams: map[Source]*stream{}}
	if cfg.Bind != "" {
		s.bind = zmtp.NewSocket(zmtp.SUB, s.sockOptions())
		a, err := s.bind.Listen(cfg.Bind)
		if err != nil {
			cancel()
			s.bind.Close()
			return nil, fmt.Errorf("--kv-events-bind: %w", err)
		}
		s.BindAddr = a
		s.wg.Go(func() { s.read(s.bind, "") })
	}
	return s, nil
}

func (s *Service) sockOptions() zmtp.Options {
	return zmtp.Options{MaxFrame: s.cfg.MaxFrame, MaxFrames: 4, Subscribe: []string{""}}
}

// Index returns the block index.
func (s *Service) Index() *Index { return s.idx }

// Track starts following worker w: its URL maps topics to it, and its publisher is dialed when
// it has an EndpointLabel or Config.Port is set. Tracking a worker twice is a no-op.
func (s *Service) Track(w *worker.Worker) error {
	pubEP, err := endpointFor(w, EndpointLabel, s.cfg.Port)
	if err != nil {
		return err
	}
	replayEP, err := endpointFor(w, ReplayLabel, s.cfg.ReplayPort)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.workers[w.ID]; ok || s.ctx.Err() != nil {
		return nil
	}
	t := &tracked{id: w.ID, replay: replayEP}
	s.workers[w.ID] = t
	s.byAddr[w.URL.Host] = w.ID
	if pubEP != "" {
		opts := s.sockOptions()
		// Once connected to the worker's publisher, its stream exists even before its first
		// event: the worker holds nothing we know of, which lets matches answer for it.
		id := w.ID
		opts.OnJoin = func(zmtp.Peer) { s.idx.Expect(Source{Worker: id}) }
		t.sock = zmtp.NewSocket(zmtp.SUB, opts)
		t.sock.Dial(pubEP)
		s.wg.Go(func() { s.read(t.sock, w.ID) })
	}
	return nil
}

// endpointFor returns the worker's endpoint from its label, else from port on its host, else "".
func endpointFor(w *worker.Worker, label string, port int) (string, error) {
	if ep := w.Label(label); ep != "" {
		rest, ok := strings.CutPrefix(ep, "tcp://")
		host, _, err := net.SplitHostPort(rest)
		if !ok || err != nil {
			return "", fmt.Errorf("label %s=%q: want tcp://host:port", label, ep)
		}
		// An engine publishes from its own host: a label may choose the port, not another host,
		// so that registering a worker cannot make the gateway dial anywhere else.
		if !strings.EqualFold(strings.Trim(host, "[]"), w.URL.Hostname()) {
			return "", fmt.Errorf("label %s=%q: the host must be the worker's own, %s", label, ep, w.URL.Hostname())
		}
		return ep, nil
	}
	if port == 0 {
		return "", nil
	}
	return "tcp://" + net.JoinHostPort(w.URL.Hostname(), fmt.Sprint(port)), nil
}

// Forget stops following the worker and drops everything the index holds for it.
func (s *Service) Forget(id string) {
	s.mu.Lock()
	t := s.workers[id]
	delete(s.workers, id)
	for a, wid := range s.byAddr {
		if wid == id {
			delete(s.byAddr, a)
		}
	}
	for src := range s.streams {
		if src.Worker == id {
			delete(s.streams, src)
		}
	}
	s.mu.Unlock()
	if t != nil && t.sock != nil {
		t.sock.Close()
	}
	s.idx.Forget(id)
}

// Close stops ingestion and waits for its goroutines.
func (s *Service) Close() error {
	s.cancel()
	s.mu.Lock()
	var socks []*zmtp.Socket
	for _, t := range s.workers {
		if t.sock != nil {
			socks = append(socks, t.sock)
		}
	}
	s.mu.Unlock()
	if s.bind != nil {
		s.bind.Close()
	}
	for _, k := range socks {
		k.Close()
	}
	s.wg.Wait()
	return nil
}

// Stats returns the counters.
func (s *Service) Stats() Stats {
	st := Stats{
		Batches: s.batches.Load(), Malformed: s.malformed.Load(), Unknown: s.unknown.Load(),
		Gaps: s.gaps.Load(), Replayed: s.replayed.Load(), Resyncs: s.resyncs.Load(),
		Restarts: s.restarts.Load(), Index: s.idx.Stats(),
	}
	if s.bind != nil {
		st.Dropped += s.bind.Dropped()
	}
	s.mu.Lock()
	for _, t := range s.workers {
		if t.sock != nil {
			st.Dropped += t.sock.Dropped()
		}
	}
	s.mu.Unlock()
	return st
}

// read handles the messages of one SUB socket until Close; workerID is the dialed worker, ""
// for the bound socket (whose topics name the worker).
func (s *Service) read(sock *zmtp.Socket, workerID string) {
	for {
		m, err := sock.Recv(s.ctx)
		if err != nil {
			return
		}
		s.handle(workerID, m)
		if s.cfg.AfterMessage != nil {
			s.cfg.AfterMessage()
		}
	}
}

// handle applies one [topic, seq, payload] message.
func (s *Service) handle(workerID string, m [][]byte) {
	if len(m) != 3 || len(m[1]) != 8 {
		s.malformed.Add(1)
		return
	}
	addr, model, ok := parseTopic(string(m[0]))
	if !ok {
		s.malformed.Add(1)
		return
	}
	s.mu.Lock()
	// The topic's address names the worker; on a dialed socket it wins when it names another
	// registered worker (an endpoint that reaches the wrong engine, as a shared port on a
	// host running several engines does), else the dialed worker is meant.
	if id, ok := s.byAddr[addr]; ok && addr != "" {
		workerID = id
	}
	t := s.workers[workerID]
	s.mu.Unlock()
	if t == nil {
		s.unknown.Add(1)
		return
	}
	b, err := Decode(m[2])
	if err != nil {
		s.malformed.Add(1)
		return
	}
	src := Source{Worker: workerID, Model: model, Rank: b.Rank}
	s.mu.Lock()
	st := s.streams[src]
	if st == nil {
		n := 0
		for o := range s.streams {
			if o.Worker == src.Worker {
				n++
			}
		}
		if n >= maxSourcesPerWorker {
			// A publisher inventing models or ranks: its new streams are dropped.
			s.mu.Unlock()
			s.unknown.Add(1)
			return
		}
		st = &stream{}
		s.streams[src] = st
	}
	s.mu.Unlock()
	seq := binary.BigEndian.Uint64(m[1])
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case !st.started || seq == st.last+1:
	case seq == 0 && st.last > 0:
		// The publisher restarted: its engine's cache started empty too.
		s.restarts.Add(1)
		s.idx.Reset(src, time.Time{})
	case seq <= st.last:
		return // a duplicate (the same engine reached us twice) or a replayed batch seen already
	default:
		s.gaps.Add(1)
		s.fillGap(t, src, st.last+1, seq)
	}
	st.started, st.last = true, seq
	s.idx.Apply(src, b.Events)
	s.batches.Add(1)
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
// fails, it drops the source's picture and distrusts it for Config.Resync.
func (s *Service) fillGap(t *tracked, src Source, from, to uint64) {
	if t.replay != "" {
		if batches, ok := s.replay(t.replay, src, from, to); ok {
			for _, b := range batches {
				s.idx.Apply(src, b.Events)
				s.batches.Add(1)
			}
			s.replayed.Add(1)
			return
		}
	}
	s.resyncs.Add(1)
	s.cfg.Logger.Warn("kv events: sequence gap not replayed, dropping the worker's cache picture until it is rebuilt",
		"worker", src.Worker, "model", src.Model, "rank", src.Rank, "missing_from", from, "missing_to", to)
	s.idx.Reset(src, s.cfg.Now().Add(s.cfg.Resync))
}

// replay fetches batches [from, to) of src from endpoint; ok is false unless every one came.
func (s *Service) replay(endpoint string, src Source, from, to uint64) ([]Batch, bool) {
	if to-from > 1<<16 {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmtp.NewSocket(zmtp.DEALER, zmtp.Options{MaxFrame: s.cfg.MaxFrame, MaxFrames: 4})
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		return nil, false
	}
	if err := d.Send(ctx, [][]byte{nil, seqBytes(from)}); err != nil {
		return nil, false
	}
	var out []Batch
	next := from
	for {
		m, err := d.Recv(ctx)
		if err != nil || len(m) != 3 || len(m[1]) != 8 {
			return nil, false
		}
		if string(m[1]) == string(endSeq) {
			return out, next == to
		}
		seq := binary.BigEndian.Uint64(m[1])
		if seq < next || seq >= to {
			continue // before the gap (already applied) or after it (live messages carry it)
		}
		if seq != next {
			return nil, false // the publisher no longer buffers part of the gap
		}
		b, err := Decode(m[2])
		if err != nil || b.Rank != src.Rank {
			return nil, false
		}
		out = append(out, b)
		next++
	}
}
