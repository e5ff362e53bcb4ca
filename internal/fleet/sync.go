package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvgate/kvgate/internal/replicasync"
)

// SyncModel models the replica sync plane (package replicasync) between the simulated gateways:
// each runs the same replicasync.Node the gateway runs, on the virtual clock, over a modelled
// bus that delivers every batch to every other gateway after Delay, losing Loss of them, and
// that goes down for good at LostAt. The zero value is off: replicas estimate each other.
type SyncModel struct {
	// Enabled turns the sync plane on.
	Enabled bool
	// Delay is the bus's one-way delay. Default 0 (the batch arrives at the same virtual
	// instant, after the decision that sent it).
	Delay time.Duration
	// Loss is the share of batches lost per receiver, in [0, 1).
	Loss float64
	// LostAt, when positive, is the virtual time at which the bus goes down for the rest of
	// the run: every replica then routes as without sync (fails open).
	LostAt time.Duration
}

// Validate reports the first invalid field.
func (m SyncModel) Validate() error {
	switch {
	case m.Delay < 0 || m.Delay > time.Minute:
		return fmt.Errorf("fleet: replica sync delay %v must be in [0, 1m]", m.Delay)
	case !(m.Loss >= 0 && m.Loss < 1):
		return errors.New("fleet: replica sync loss must be in [0, 1)")
	case m.LostAt < 0:
		return errors.New("fleet: replica sync lost-at must be >= 0")
	}
	return nil
}

// label is the part of a row label that names the model: "+sync(1ms)", "+sync(1ms,loss 1%)".
func (m SyncModel) label() string {
	if !m.Enabled {
		return ""
	}
	s := "+sync(" + m.Delay.String()
	if m.Loss > 0 {
		s += fmt.Sprintf(",loss %g%%", 100*m.Loss)
	}
	if m.LostAt > 0 {
		s += ",lost at " + m.LostAt.String()
	}
	return s + ")"
}

// syncBus is the modelled bus: the batches in flight, by the id their delivery event carries.
type syncBus struct {
	m      SyncModel
	rng    *rand.Rand
	flying map[uint64][]byte
	next   uint64
	down   bool
}

func newSyncBus(m SyncModel, seed uint64) *syncBus {
	return &syncBus{m: m, rng: rand.New(rand.NewPCG(seed, 0x5c)), flying: map[uint64][]byte{}}
}

// newSyncNode returns gateway g's sync Node on the virtual clock.
func (s *sim) newSyncNode() (*replicasync.Node, error) {
	return replicasync.NewNode(replicasync.Config{Now: func() time.Time { return epoch.Add(s.now) }})
}

// publish flushes gateway g's Node onto the bus: each batch is queued for every other gateway
// after the delay, unless lost.
func (s *sim) publish(g int) {
	b := s.bus
	node := s.gws[g].node
	if node == nil {
		return
	}
	if b.m.LostAt > 0 && s.now >= b.m.LostAt && !b.down {
		b.down = true
		for _, gw := range s.gws {
			if gw.node != nil {
				gw.node.SetUp(false)
			}
		}
	}
	_ = node.Flush(func(msg []byte) error {
		if b.down {
			return nil // the batch is lost with the bus
		}
		for to := range s.gws {
			if to == g || b.m.Loss > 0 && b.rng.Float64() < b.m.Loss {
				continue
			}
			b.next++
			b.flying[b.next] = append([]byte(nil), msg...)
			s.push(event{at: s.now + b.m.Delay, kind: evSync, idx: to, ver: b.next})
		}
		return nil
	})
}

// deliverSync applies a batch that reached gateway to.
func (s *sim) deliverSync(to int, id uint64) {
	msg := s.bus.flying[id]
	delete(s.bus.flying, id)
	if s.bus.down {
		return
	}
	_ = s.gws[to].node.Apply(msg)
}
