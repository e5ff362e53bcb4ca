package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/kvgate/kvgate/internal/kvevents/zmtp"
)

// endSeq is the sequence number that ends a replay (-1 as a signed 8-byte big-endian integer).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// PublisherConfig says where a Publisher sends its events. At least one of Bind and Dial is set.
type PublisherConfig struct {
	// Bind is a ZeroMQ endpoint the PUB socket binds ("tcp://*:5557", vLLM's default), "" for
	// none.
	Bind string
	// Dial lists SUB endpoints (gateways' --kv-events-bind) the PUB socket connects to.
	Dial []string
	// ReplayBind is the endpoint of the ROUTER socket that re-sends buffered batches, "" for
	// none.
	ReplayBind string
	// Topic is the first frame of every message: kv@<host>:<port>@<model>.
	Topic string
	// Buffer is how many recent batches the replay socket can re-send. Default 10000 (vLLM's
	// buffer_steps).
	Buffer int
	// Encoding is how events are written; the zero value is the legacy array encoding.
	Encoding Encoding
}

// Publisher publishes KV-cache event batches the way vLLM does: multipart [topic, seq, payload]
// on a PUB socket, seq an 8-byte big-endian counter from 0, and a ROUTER replay socket that
// answers [empty, start seq] with [empty, seq, payload] for every buffered batch from start,
// then [empty, -1, empty]. Safe for concurrent use; Close stops it.
type Publisher struct {
	cfg    PublisherConfig
	pub    *zmtp.Socket
	replay *zmtp.Socket
	// Addr and ReplayAddr are the bound addresses (host:port), "" when not bound.
	Addr, ReplayAddr string

	mu   sync.Mutex
	seq  uint64
	ring []buffered // the last Buffer batches, oldest at head
	head int

	cancel context.CancelFunc
	done   chan struct{}
}

type buffered struct {
	seq     uint64
	payload []byte
}

// NewPublisher binds and dials what cfg says and starts the replay server.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Bind == "" && len(cfg.Dial) == 0 {
		return nil, errors.New("kvevents: a publisher needs a bind or a dial endpoint")
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10000
	}
	p := &Publisher{cfg: cfg, pub: zmtp.NewSocket(zmtp.PUB, zmtp.Options{}), done: make(chan struct{})}
	fail := func(err error) (*Publisher, error) {
		p.pub.Close()
		if p.replay != nil {
			p.replay.Close()
		}
		return nil, err
	}
	if cfg.Bind != "" {
		a, err := p.pub.Listen(cfg.Bind)
		if err != nil {
			return fail(err)
		}
		p.Addr = a
	}
	for _, d := range cfg.Dial {
		if err := p.pub.Dial(d); err != nil {
			return fail(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	if cfg.ReplayBind == "" {
		close(p.done)
		return p, nil
	}
	p.replay = zmtp.NewSocket(zmtp.ROUTER, zmtp.Options{MaxFrame: 64})
	a, err := p.replay.Listen(cfg.ReplayBind)
	if err != nil {
		cancel()
		return fail(err)
	}
	p.ReplayAddr = a
	go p.serveReplay(ctx)
	return p, nil
}

// Publish encodes b, numbers it and sends it; a subscriber too slow to take it loses it (and
// sees a gap). It never blocks on the network.
func (p *Publisher) Publish(b *Batch) error {
	var buf bytes.Buffer
	if err := Encode(&buf, b, p.cfg.Encoding); err != nil {
		return err
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.keep(seq, buf.Bytes())
	p.mu.Unlock()
	return p.pub.Send(context.Background(), [][]byte{[]byte(p.cfg.Topic), seqBytes(seq), buf.Bytes()})
}

// keep adds a batch to the replay ring. Callers hold mu.
func (p *Publisher) keep(seq uint64, payload []byte) {
	if len(p.ring) < p.cfg.Buffer {
		p.ring = append(p.ring, buffered{seq, payload})
		return
	}
	p.ring[p.head] = buffered{seq, payload}
	p.head = (p.head + 1) % len(p.ring)
}

// skip consumes a sequence number whose batch is buffered but never sent: tests use it to make
// a gap that a replay can fill.
func (p *Publisher) skip(b *Batch) {
	var buf bytes.Buffer
	Encode(&buf, b, p.cfg.Encoding)
	p.mu.Lock()
	p.keep(p.seq, buf.Bytes())
	p.seq++
	p.mu.Unlock()
}

func seqBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// Published returns how many batches were numbered so far (the next sequence number).
func (p *Publisher) Published() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// WaitSubscribers blocks until n subscribers are connected and subscribed, or ctx ends.
func (p *Publisher) WaitSubscribers(ctx context.Context, n int) error {
	return p.pub.WaitPeers(ctx, n)
}

// serveReplay answers replay requests until ctx ends.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer close(p.done)
	for {
		m, err := p.replay.Recv(ctx)
		if err != nil {
			return
		}
		// [identity, empty, start seq]; REQ and DEALER clients both send the empty delimiter.
		if len(m) != 3 || len(m[1]) != 0 || len(m[2]) != 8 {
			continue
		}
		id, start := m[0], binary.BigEndian.Uint64(m[2])
		p.mu.Lock()
		var out []buffered
		n := len(p.ring)
		for i := range n {
			b := p.ring[(p.head+i)%n]
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		for _, b := range out {
			if p.replay.Send(ctx, [][]byte{id, nil, seqBytes(b.seq), b.payload}) != nil {
				break
			}
		}
		p.replay.Send(ctx, [][]byte{id, nil, endSeq, nil})
	}
}

// Close stops publishing and replaying.
func (p *Publisher) Close() error {
	p.cancel()
	<-p.done
	p.pub.Close()
	if p.replay != nil {
		p.replay.Close()
	}
	return nil
}

// Topic returns the topic of an engine serving model at host:port.
func Topic(hostPort, model string) string { return fmt.Sprintf("kv@%s@%s", hostPort, model) }
