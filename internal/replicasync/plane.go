package replicasync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Subject is the NATS subject every replica publishes its batches on and subscribes to: named
// by purpose and version, so a future format travels on its own subject beside this one.
const Subject = "kvgate.v1.decisions"

// Pending limits of the subscription: past them the client drops batches (a slow consumer),
// and each drop is counted.
const (
	pendingMsgs  = 8192
	pendingBytes = 64 << 20
)

// PlaneConfig configures a Plane.
type PlaneConfig struct {
	// Node bounds the Node.
	Node Config
	// FlushDelay, when positive, is a window records that follow a published one wait in, to
	// go out as one batch. Zero (the default) batches without waiting: a record goes out at
	// once, and the records that arrive while a batch is being published go out together in
	// the next (measured: a timer window costs milliseconds of latency on a loaded machine).
	FlushDelay time.Duration
	// Logger receives the transitions (bus up, down); nil discards them.
	Logger *slog.Logger
}

// Plane runs a Node over NATS in real time: it publishes the Node's batches after FlushDelay
// (and a heartbeat every Node heartbeat), applies every peer's batch as it arrives, and fails
// open: while the connection is down the Node is not Active (the routing reads nothing from
// peers), the transition is logged once each way, and what was recorded meanwhile is dropped
// on return (stale sends would count as S at receipt), after which sharing resumes.
type Plane struct {
	node *Node
	nc   *nats.Conn
	sub  *nats.Subscription
	srv  *embeddedServer // nil unless embedded
	log  *slog.Logger
	wait time.Duration

	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}

	downMu sync.Mutex
	down   bool
	// discard tells the loop to drop what was recorded while the bus was down.
	discard atomic.Bool
}

// newPlane starts a Plane on nc (connected, or connecting); srv is the embedded server it owns.
func newPlane(cfg PlaneConfig, connect func(opts ...nats.Option) (*nats.Conn, error), srv *embeddedServer) (*Plane, error) {
	node, err := NewNode(cfg.Node)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Plane{node: node, srv: srv, log: log, wait: cfg.FlushDelay, kick: make(chan struct{}, 1), done: make(chan struct{})}
	node.notify = p.kick1
	nc, err := connect(
		nats.Name("kvgate replica sync"),
		nats.NoEcho(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// Nothing is buffered while disconnected: a batch from before an outage would count as
		// S at receipt.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { p.setDown(true) }),
		nats.ReconnectHandler(func(*nats.Conn) { p.setDown(false) }),
		nats.ConnectHandler(func(*nats.Conn) { p.setDown(false) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				node.stats.SlowConsumer.Add(1)
			}
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("replica sync: connecting: %w", err)
	}
	p.nc = nc
	sub, err := nc.Subscribe(Subject, func(m *nats.Msg) { _ = node.Apply(m.Data) })
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("replica sync: subscribing: %w", err)
	}
	if err := sub.SetPendingLimits(pendingMsgs, pendingBytes); err != nil {
		nc.Close()
		return nil, fmt.Errorf("replica sync: %w", err)
	}
	p.sub = sub
	if !nc.IsConnected() {
		p.setDown(true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	go p.loop(ctx)
	return p, nil
}

// Node returns the Plane's Node: the routing's view of the peers (policy.Peers) and where the
// gateway records finishes and bindings.
func (p *Plane) Node() *Node { return p.node }

// kick1 tells the loop a record is waiting (the Node calls it after each).
func (p *Plane) kick1() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// setDown records a transition of the connection, logging each once.
func (p *Plane) setDown(down bool) {
	p.downMu.Lock()
	defer p.downMu.Unlock()
	if p.down == down {
		return
	}
	p.down = down
	p.node.SetUp(!down)
	if down {
		p.log.Warn("replica sync: bus down; routing on estimates of the other replicas until it returns")
		return
	}
	p.discard.Store(true)
	p.log.Info("replica sync: bus up; sharing decisions with the other replicas")
}

// loop publishes: a record after a quiet FlushDelay (or any, with none) goes out at once,
// records that follow within it wait for the end of it and go out as one batch; every half
// heartbeat it flushes (the Node adds a heartbeat when it had nothing to say).
func (p *Plane) loop(ctx context.Context) {
	defer close(p.done)
	hb := time.NewTicker(p.node.cfg.Heartbeat / 2)
	defer hb.Stop()
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	gathering := false
	var last time.Time
	flush := func() {
		if p.discard.Swap(false) {
			p.node.Discard()
		}
		if !p.nc.IsConnected() {
			return
		}
		_ = p.node.Flush(p.publish)
		last = time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			flush()
			_ = p.nc.Flush()
			return
		case <-p.kick:
			switch {
			case gathering:
			case time.Since(last) >= p.wait:
				flush()
			default:
				gathering = true
				gather.Reset(p.wait)
			}
		case <-gather.C:
			gathering = false
			flush()
		case <-hb.C:
			flush()
		}
	}
}

// publish sends one batch. nats.go copies it into its write buffer before returning.
func (p *Plane) publish(b []byte) error { return p.nc.Publish(Subject, b) }

// Close publishes what is pending, stops the Plane and closes its connection and, in embedded
// mode, its server; it returns once every goroutine it started has exited.
func (p *Plane) Close() error {
	p.stop()
	<-p.done
	p.nc.Close()
	if p.srv != nil {
		p.srv.shutdown()
	}
	return nil
}
