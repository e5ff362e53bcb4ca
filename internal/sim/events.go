package sim

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
)

// Events configures KV-cache event publishing (vLLM's ZeroMQ format) for a fleet; the zero value
// publishes nothing. Engine i of a fleet publishes on topic kv@<its host:port>@<model>.
type Events struct {
	// Port, when positive, makes engine i bind its PUB socket on the fleet's host at Port+i;
	// -1 binds an ephemeral port (tests read it from Server.EventsAddr). 0 binds none.
	Port int
	// ReplayPort is the same for the replay ROUTER socket; 0 serves no replay.
	ReplayPort int
	// Dial lists SUB endpoints (gateways' --kv-events-bind) every engine connects to.
	Dial []string
	// Encoding selects the legacy array encoding (zero) or the map encoding of events.
	Encoding kvevents.Encoding
}

// Enabled reports whether e publishes anything.
func (e Events) Enabled() bool { return e.Port != 0 || len(e.Dial) > 0 }

// Validate reports an invalid field.
func (e Events) Validate() error {
	if e.Port < -1 || e.Port > 65535 || e.ReplayPort < -1 || e.ReplayPort > 65535 {
		return fmt.Errorf("sim: kv events ports %d, %d out of range", e.Port, e.ReplayPort)
	}
	if e.ReplayPort != 0 && !e.Enabled() {
		return fmt.Errorf("sim: a kv events replay port needs a kv events port or dial endpoint")
	}
	return nil
}

// endpoint returns the tcp:// endpoint of port (+i) on host, "" when port is 0.
func endpoint(host string, port, i int) string {
	switch port {
	case 0:
		return ""
	case -1:
		return "tcp://" + net.JoinHostPort(host, "0")
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(port+i))
}

// startEvents makes engine i, serving at addr (host:port), publish its cache changes.
func (s *Server) startEvents(host, addr string, i int) error {
	ev := s.cfg.Events
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{
		Bind: endpoint(host, ev.Port, i), ReplayBind: endpoint(host, ev.ReplayPort, i), Dial: ev.Dial,
		Topic: kvevents.Topic(addr, s.cfg.Model), Encoding: ev.Encoding,
	})
	if err != nil {
		return fmt.Errorf("sim: engine %d: kv events: %w", i, err)
	}
	s.mu.Lock()
	s.pub = pub
	s.eng.SetCacheObserver((*cacheEvents)(s))
	s.mu.Unlock()
	return nil
}

// EventsAddr returns the bound PUB and replay addresses (host:port; "" when not bound).
func (s *Server) EventsAddr() (pub, replay string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub == nil {
		return "", ""
	}
	return s.pub.Addr, s.pub.ReplayAddr
}

// EventsPublished returns how many event batches the server published (0 when it publishes none).
func (s *Server) EventsPublished() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub == nil {
		return 0
	}
	return s.pub.Published()
}

// WaitEventSubscribers blocks until n subscribers receive the server's events, or ctx ends.
func (s *Server) WaitEventSubscribers(ctx context.Context, n int) error {
	s.mu.Lock()
	pub := s.pub
	s.mu.Unlock()
	if pub == nil {
		return fmt.Errorf("sim: the server publishes no events")
	}
	return pub.WaitSubscribers(ctx, n)
}

// cacheEvents is the Server as the engine's CacheObserver: it gathers the changes of one engine
// operation into s.batch (under s.mu), which publishEvents sends.
type cacheEvents Server

func (c *cacheEvents) BlockStored(at time.Duration, key, parent uint64, hasParent bool, toks []uint32) {
	b := &c.batch
	if n := len(b.Events); n > 0 {
		// Extend the previous event when this block continues its chain, as vLLM does.
		if e := &b.Events[n-1]; e.Kind == kvevents.BlockStored && hasParent && e.Hashes[len(e.Hashes)-1] == parent && e.LoRAName == c.storedAdapter {
			e.Hashes = append(e.Hashes, key)
			e.Tokens = append(e.Tokens, toks...)
			c.storedAdapter = ""
			return
		}
	}
	b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{key},
		Parent: parent, HasParent: hasParent, Tokens: append([]uint32(nil), toks...), BlockSize: len(toks)})
	e := &b.Events[len(b.Events)-1]
	c.withAdapter(e) // events_lora.go
	if !hasParent && c.storedSalt != "" {
		e.ExtraKeys = append(e.ExtraKeys, c.storedSalt)
	}
	c.storedSalt = ""
}

// StoredSalt notes the salt of the prompt whose first block is stored next (engine.SaltObserver):
// its event carries it as the block's extra key, as vLLM's do.
func (c *cacheEvents) StoredSalt(salt string) { c.storedSalt = salt }

func (c *cacheEvents) BlockRemoved(at time.Duration, key uint64) {
	b := &c.batch
	if n := len(b.Events); n > 0 && b.Events[n-1].Kind == kvevents.BlockRemoved {
		b.Events[n-1].Hashes = append(b.Events[n-1].Hashes, key)
		return
	}
	b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{key}})
}

func (c *cacheEvents) CacheCleared(at time.Duration) {
	c.batch.Events = append(c.batch.Events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
}

// publishEvents sends the changes gathered since the last call as one batch. Callers hold mu.
func (s *Server) publishEvents() {
	if s.pub == nil || len(s.batch.Events) == 0 {
		return
	}
	s.batch.TS = float64(time.Now().UnixNano()) / 1e9
	s.pub.Publish(&s.batch)
	s.batch = kvevents.Batch{}
}

// closeEvents stops publishing.
func (s *Server) closeEvents() {
	s.mu.Lock()
	pub := s.pub
	s.pub = nil
	s.mu.Unlock()
	if pub != nil {
		pub.Close()
	}
}

var _ engine.CacheObserver = (*cacheEvents)(nil)
