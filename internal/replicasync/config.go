package replicasync

import (
	"errors"
	"time"
)

// Config bounds a Node. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Key is the cluster's secret: it keys the chunk hashes (Chainer), so every replica of a
	// cluster must share it. Empty: an unkeyed cluster (loopback only).
	Key []byte
	// Now is the clock; nil means time.Now. Every age is measured at receipt on it.
	Now func() time.Time
	// PeerTimeout is how long a peer stays counted without a batch from it. Default 3 s (three
	// heartbeats).
	PeerTimeout time.Duration
	// Heartbeat is how often a replica publishes an empty batch when it has nothing else to say.
	// Default 1 s.
	Heartbeat time.Duration
	// MaxPeers bounds the peers tracked; a batch from one more is dropped and counted. Default 64.
	MaxPeers int
	// PeerRecords bounds each peer's records per second (a token bucket with a second's burst);
	// a batch over it is dropped and counted. Default 50000.
	PeerRecords float64
	// PeerBytes bounds each peer's bytes per second, likewise. Default 8 MiB.
	PeerBytes float64
	// BanFor is how long a peer that sent a malformed batch is ignored. Default 1 min.
	BanFor time.Duration
	// MaxPlacements bounds the peer-placement view of one model, in chunk hashes × workers; the
	// oldest placement is forgotten past it (a FIFO, like an engine's cache). Default 2^18
	// (~24 MiB at most per model).
	MaxPlacements int
	// MaxModels bounds the models with a placement view. Default 256.
	MaxModels int
	// MaxWorkers bounds the workers tracked; the least recently heard is recycled past it.
	// Default 4096.
	MaxWorkers int
	// Window bounds the peer sends and finishes remembered per worker (the span S is summed
	// over: since the engine's last report). Default 4096 each.
	Window int
	// MaxPeerSent caps S from peers per worker, in tokens. Default 2^24.
	MaxPeerSent float64
	// MaxAffinity bounds each affinity table (response ids, sessions). Default 200000.
	MaxAffinity int
	// AffinityTTL is how long a shared binding is honoured after it was received. Default 30 min.
	AffinityTTL time.Duration
	// MaxPending bounds the batches waiting to be published; the oldest is dropped past it.
	// Default 256.
	MaxPending int
}

// DefaultConfig returns the defaults (see each field).
func DefaultConfig() Config {
	return Config{PeerTimeout: 3 * time.Second, Heartbeat: time.Second, MaxPeers: 64, PeerRecords: 50000,
		PeerBytes: 8 << 20, BanFor: time.Minute, MaxPlacements: 1 << 18, MaxModels: 256, MaxWorkers: 4096,
		Window: 4096, MaxPeerSent: 1 << 24, MaxAffinity: 200000, AffinityTTL: 30 * time.Minute, MaxPending: 256}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Now == nil {
		c.Now = time.Now
	}
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	setf := func(v *float64, def float64) {
		if !(*v > 0) {
			*v = def
		}
	}
	setd := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	setd(&c.PeerTimeout, d.PeerTimeout)
	setd(&c.Heartbeat, d.Heartbeat)
	setd(&c.BanFor, d.BanFor)
	setd(&c.AffinityTTL, d.AffinityTTL)
	set(&c.MaxPeers, d.MaxPeers)
	set(&c.MaxPlacements, d.MaxPlacements)
	set(&c.MaxModels, d.MaxModels)
	set(&c.MaxWorkers, d.MaxWorkers)
	set(&c.Window, d.Window)
	set(&c.MaxAffinity, d.MaxAffinity)
	set(&c.MaxPending, d.MaxPending)
	setf(&c.PeerRecords, d.PeerRecords)
	setf(&c.PeerBytes, d.PeerBytes)
	setf(&c.MaxPeerSent, d.MaxPeerSent)
	return c
}

// validate reports the first bound that would make a Node meaningless.
func (c Config) validate() error {
	switch {
	case c.MaxWorkers > 1<<16-1:
		return errors.New("replica sync: max workers must be below 65535")
	case c.MaxPlacements > 1<<24:
		return errors.New("replica sync: max placements must be at most 2^24")
	}
	return nil
}
