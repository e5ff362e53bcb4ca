package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
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
	// PublisherLabel lists, comma-separated, addresses or CIDRs besides the worker's own host
	// that may publish events for it (an engine behind NAT, or one whose events leave from
	// another interface than the one it serves on).
	PublisherLabel = "kv_events_publisher"
)

// Config configures event ingestion. The zero value ingests nothing.
type Config struct {
	// Bind is a SUB endpoint engines dial, tcp://host:port; "" for none. A missing host
	// ("tcp://:5557") means loopback. A host beyond loopback ("*", 0.0.0.0, an interface
	// address) needs AllowedHosts: New fails without it.
	Bind string
	// AllowedHosts lists the addresses, CIDRs and host names (resolved at start and every
	// minute after) whose connections Bind accepts; others are closed before a byte is read.
	// Empty: loopback only.
	AllowedHosts []string
	// Port, when not 0, makes the gateway dial every worker's publisher at tcp://<worker
	// host>:Port (vLLM binds tcp://*:5557 by default). Workers on one host share the endpoint,
	// and the topic's address tells their events apart.
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
	// MaxBuffered bounds, in bytes over every publisher, the frames being received and the
	// messages waiting to be applied (past it, messages are dropped: a gap). Default 24 MiB;
	// with MaxDecoded, what hostile publishers can make ingestion hold stays under 64 MiB.
	MaxBuffered int64
	// MaxDecoded bounds what one batch decodes to, in bytes; batches are decoded one at a time.
	// Default 16 MiB.
	MaxDecoded int
	// MaxPublishers bounds the connections Bind serves at once. Default 1024.
	MaxPublishers int
	// ReplayTimeout bounds one replay request. Default 2 s.
	ReplayTimeout time.Duration
	// Resync is how long a worker's picture is distrusted after it was dropped for a gap that
	// no replay filled, and how long a stream outlives its publisher's connection before its
	// picture is dropped; the prefix tree routes meanwhile. Default 10 s.
	Resync time.Duration
	// MaxJump is how far a sequence number may run ahead of the last one before the stream is
	// taken as restarted rather than as having a gap (and as far as a replay is asked to
	// reach). Default 65536.
	MaxJump uint64
	// SilentAfter is how long a tracked worker may stay without any event stream before a
	// warning says so, once. Default 60 s.
	SilentAfter time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Lookup resolves a host name; nil means net.DefaultResolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
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
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = 24 << 20
	}
	c.MaxBuffered = max(c.MaxBuffered, 2*int64(c.MaxFrame))
	if c.MaxDecoded <= 0 {
		c.MaxDecoded = 16 << 20
	}
	if c.MaxPublishers <= 0 {
		c.MaxPublishers = 1024
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Second
	}
	if c.MaxJump == 0 {
		c.MaxJump = 1 << 16
	}
	if c.SilentAfter <= 0 {
		c.SilentAfter = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Lookup == nil {
		c.Lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
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
	// messages whose topic names no registered worker (or a worker's stream past its bound);
	// Rejected messages from a publisher that may not speak for the worker they name.
	Batches, Malformed, Unknown, Rejected uint64
	// Gaps seen; Replayed gaps filled by a replay; Resyncs: gaps, and jumps too far to be gaps,
	// that dropped a worker's picture; Restarts: publishers seen starting over.
	Gaps, Replayed, Resyncs, Restarts uint64
	// Dropped messages at a full socket queue (each makes a gap).
	Dropped uint64
	// Buffered is the bytes of frames being received and of messages waiting, now.
	Buffered int64
	Index    IndexStats
}

// Service ingests KV-cache events from every worker into one Index. Create it with New, follow
// the registry with Track and Forget, stop it with Close.
type Service struct {
	cfg    Config
	idx    *Index
	budget *zmtp.Budget
	allow  atomic.Pointer[[]netip.Prefix] // who may connect to the bound socket

	bind     *zmtp.Socket
	BindAddr string // the bound SUB address, "" when not bound

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// ingest serializes handling: one batch is decoded and applied at a time, which bounds
	// decoding memory to MaxDecoded (the index applies under one lock anyway).
	ingest sync.Mutex

	mu      sync.Mutex
	workers map[string]*tracked // by worker id
	byAddr  map[string]string   // host:port of a worker URL → worker id
	dialed  map[string]*dialed  // by endpoint
	streams map[Source]*stream
	live    map[connKey]bool // connections up now
	warned  map[string]bool  // one-off warnings given (bounded)

	batches, malformed, unknown, rejected atomic.Uint64
	gaps, replayed, resyncs, restarts     atomic.Uint64
}

// tracked is one registered worker.
type tracked struct {
	id       string
	hostPort string // of its URL
	host     string // of its URL, without brackets
	replay   string // replay endpoint, "" for none
	endpoint string // dialed endpoint, "" when it only publishes to the bound socket
	allowed  []netip.Prefix
	since    time.Time // when it was tracked

	// Guarded by Service.mu.
	addrs      []netip.Addr // its host's addresses
	resolvedAt time.Time
	publishing bool // its events started and have not stopped since
	heard      bool // it has had an event stream since it was tracked
	silent     bool // the silence warning was given
}

// dialed is one dialed publisher endpoint and the workers reached through it.
type dialed struct {
	endpoint string
	sock     *zmtp.Socket
	workers  []string
}

// connKey names one connection of one socket.
type connKey struct {
	sock *zmtp.Socket
	id   uint64
}

// stream is the sequence state of one source. Guarded by Service.mu.
type stream struct {
	last    uint64
	started bool
	conn    connKey   // the connection its messages last came on
	via     string    // that connection's endpoint or source address, for logs
	leftAt  time.Time // when that connection ended; zero while it is up
	// back is a new connection to the dialed endpoint the stream came on, after conn ended:
	// the stream waits on it instead (its first message will tell a restart from a blip).
	back   connKey
	replay time.Time // the last replay asked for it
}

// New starts ingestion: it binds cfg.Bind when set. Workers are dialed as Track registers them.
func New(cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, idx: NewIndex(cfg.MaxBlocks, maxSourcesPerWorker), ctx: ctx, cancel: cancel,
		budget:  zmtp.NewBudget(cfg.MaxBuffered),
		workers: map[string]*tracked{}, byAddr: map[string]string{}, dialed: map[string]*dialed{},
		streams: map[Source]*stream{}, live: map[connKey]bool{}, warned: map[string]bool{}}
	if cfg.Bind != "" {
		if err := s.listen(); err != nil {
			cancel()
			return nil, err
		}
	}
	s.wg.Go(s.supervise)
	return s, nil
}

// listen binds cfg.Bind, loopback unless it names a host, and only with an allow-list beyond it.
func (s *Service) listen() error {
	ep, loopback, err := bindEndpoint(s.cfg.Bind)
	if err != nil {
		return fmt.Errorf("--kv-events-bind: %w", err)
	}
	if !loopback && len(s.cfg.AllowedHosts) == 0 {
		return fmt.Errorf("--kv-events-bind %s listens beyond loopback, where anyone who reaches it could "+
			"rewrite what the gateway believes engines cache: list the engines' addresses or CIDRs with "+
			"--kv-events-allowed-hosts (e.g. 10.0.0.0/16)", s.cfg.Bind)
	}
	if err := s.refreshAllowed(); err != nil {
		return fmt.Errorf("--kv-events-allowed-hosts: %w", err)
	}
	opts := s.sockOptions()
	opts.MaxPeers = s.cfg.MaxPublishers
	opts.Allow = s.allowed
	s.bind = s.newSocket(opts)
	a, err := s.bind.Listen(ep)
	if err != nil {
		s.bind.Close()
		return fmt.Errorf("--kv-events-bind: %w", err)
	}
	s.BindAddr = a
	s.wg.Go(func() { s.read(s.bind) })
	return nil
}

// bindEndpoint normalizes a bind endpoint: a missing host is loopback. loopback reports whether
// only this machine can reach it.
func bindEndpoint(ep string) (_ string, loopback bool, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	host, port, err := net.SplitHostPort(rest)
	if !ok || err != nil {
		return "", false, fmt.Errorf("%q: want tcp://host:port", ep)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	a, err := netip.ParseAddr(host)
	loopback = strings.EqualFold(host, "localhost") || err == nil && a.IsLoopback()
	return "tcp://" + net.JoinHostPort(host, port), loopback, nil
}

// sockOptions are the options every SUB socket of the service shares.
func (s *Service) sockOptions() zmtp.Options {
	return zmtp.Options{MaxFrame: s.cfg.MaxFrame, MaxFrames: 4, Budget: s.budget, Subscribe: []string{""}}
}

// newSocket returns a SUB socket whose connections the service follows.
func (s *Service) newSocket(opts zmtp.Options) *zmtp.Socket {
	var sock *zmtp.Socket
	opts.OnJoin = func(p zmtp.Peer) { s.joined(sock, p) }
	opts.OnLeave = func(p zmtp.Peer) { s.left(sock, p) }
	sock = zmtp.NewSocket(zmtp.SUB, opts)
	return sock
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
	allowed, err := parsePrefixes(w.Label(PublisherLabel))
	if err != nil {
		return fmt.Errorf("label %s: %w", PublisherLabel, err)
	}
	host := w.URL.Hostname()
	t := &tracked{id: w.ID, hostPort: w.URL.Host, host: host, replay: replayEP, endpoint: pubEP,
		allowed: allowed, since: s.cfg.Now()}
	if a, err := netip.ParseAddr(host); err == nil {
		t.addrs = []netip.Addr{a.Unmap()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.workers[w.ID]; ok || s.ctx.Err() != nil {
		return nil
	}
	s.workers[w.ID] = t
	s.byAddr[w.URL.Host] = w.ID
	if t.addrs == nil && !isLocalhost(host) {
		s.wg.Go(func() { s.resolve(t) })
	}
	if pubEP == "" {
		return nil
	}
	d := s.dialed[pubEP]
	if d == nil {
		d = &dialed{endpoint: pubEP, sock: s.newSocket(s.sockOptions())}
		s.dialed[pubEP] = d
		d.sock.Dial(pubEP)
		s.wg.Go(func() { s.read(d.sock) })
	} else {
		// The endpoint no longer speaks for one worker alone: a stream expected for the first
		// before it published anything is not its.
		for _, id := range d.workers {
			src := Source{Worker: id}
			if st := s.streams[src]; st != nil && !st.started {
				delete(s.streams, src)
				s.idx.Drop(src)
			}
		}
		s.cfg.Logger.Warn("kv events: several workers share one publisher endpoint (engines on one host with --kv-events-port); "+
			"only a topic kv@<host>:<port>@<model> tells their events apart: give each engine its own port and label the worker "+EndpointLabel,
			"endpoint", pubEP, "workers", strings.Join(append(slices.Clone(d.workers), w.ID), ","))
	}
	d.workers = append(d.workers, w.ID)
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
	s.ingest.Lock()
	defer s.ingest.Unlock()
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
	var closing *zmtp.Socket
	if t != nil && t.endpoint != "" {
		if d := s.dialed[t.endpoint]; d != nil {
			d.workers = slices.DeleteFunc(d.workers, func(w string) bool { return w == id })
			if len(d.workers) == 0 {
				delete(s.dialed, t.endpoint)
				closing = d.sock
			}
		}
	}
	s.mu.Unlock()
	if closing != nil {
		closing.Close()
	}
	s.idx.Forget(id)
}

// Close stops ingestion and waits for its goroutines.
func (s *Service) Close() error {
	s.cancel()
	s.mu.Lock()
	var socks []*zmtp.Socket
	for _, d := range s.dialed {
		socks = append(socks, d.sock)
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
		Rejected: s.rejected.Load(), Gaps: s.gaps.Load(), Replayed: s.replayed.Load(),
		Resyncs: s.resyncs.Load(), Restarts: s.restarts.Load(), Buffered: s.budget.Used(),
		Index: s.idx.Stats(),
	}
	if s.bind != nil {
		st.Dropped += s.bind.Dropped()
	}
	s.mu.Lock()
	for _, d := range s.dialed {
		st.Dropped += d.sock.Dropped()
	}
	s.mu.Unlock()
	return st
}

// read handles the messages of one SUB socket until Close.
func (s *Service) read(sock *zmtp.Socket) {
	for {
		m, err := sock.RecvMessage(s.ctx)
		if err != nil {
			return
		}
		s.handle(sock, m)
		m.Release()
		m = zmtp.Message{} // its frames are garbage now, whatever AfterMessage does
		if s.cfg.AfterMessage != nil {
			s.cfg.AfterMessage()
		}
	}
}
