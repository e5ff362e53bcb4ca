package replicasync

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
)

// Node is one replica's end of the sync plane: it encodes this replica's records into batches
// (Decided, Finished, Bound, then Flush) and applies its peers' (Apply) to the views the routing
// reads (SentSince, Placed, Affinity). It runs no goroutine; Plane drives it in real time, the
// fleet simulator in virtual time. Safe for concurrent use.
type Node struct {
	cfg   Config
	chain Chainer
	id    uint64
	up    atomic.Bool
	stats Stats
	// heardPeer is set once any peer's batch was applied; activeAt (Unix ns) and activeVal
	// cache Active's count of live peers.
	heardPeer atomic.Bool
	activeAt  atomic.Int64
	activeVal atomic.Bool
	// notify, when set before use (Plane), is called after every record is added; applied
	// (tests) after every batch applied.
	notify, applied func()

	omu     sync.Mutex
	seq     uint64
	out     []byte   // the batch being built (header included once it has a record)
	records int      // records in out
	ready   [][]byte // full batches waiting for Flush
	free    [][]byte // recycled batch buffers
	lastOut time.Time

	mu       sync.Mutex
	peers    map[uint64]*peer
	workers  map[string]uint16 // worker id → index into logs
	logs     []*workerLog
	candAt   []int32  // PlacedChain's scratch: worker index → candidate position + 1
	candIdx  []uint16 // PlacedChain's scratch: candidate → worker index
	models   map[string]*placement
	affinity [3]*affinityTable // by namespace
	gen      uint64            // counts placements, for recycled worker indices
}

// Stats counts what a Node did; every field is read with atomic loads (Snapshot).
type Stats struct {
	// Published counts batches handed out by Flush; Dropped the batches dropped because
	// too many were pending (the bus too slow).
	Published, Dropped atomic.Uint64
	// Applied counts batches applied; Records the records in them.
	Applied, Records atomic.Uint64
	// Duplicate counts batches seen before (redelivered, or replayed); Gaps the batches a
	// peer's sequence skipped (lost on the way).
	Duplicate, Gaps atomic.Uint64
	// Malformed counts batches that did not decode (their peer is banned for BanFor); Banned
	// the batches dropped from a banned peer; OverRate those over a peer's rate or bytes;
	// OverPeers those from a peer past MaxPeers; OverWorkers records whose worker could not be
	// tracked.
	Malformed, Banned, OverRate, OverPeers, OverWorkers atomic.Uint64
	// SlowConsumer counts batches the bus client dropped because this replica fell behind.
	SlowConsumer atomic.Uint64
}

// peer is what a Node keeps of one sender.
type peer struct {
	lastSeq     uint64
	heard       time.Time
	bannedUntil time.Time
	recTokens   float64 // token buckets, refilled by the second
	byteTokens  float64
	refilled    time.Time
}

// NewNode returns a Node with a fresh random sender id.
func NewNode(cfg Config) (*Node, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	n := &Node{cfg: c, chain: NewChainer(c.Key), id: binary.LittleEndian.Uint64(b[:]) | 1,
		peers: map[uint64]*peer{}, workers: map[string]uint16{}, models: map[string]*placement{}}
	for ns := range n.affinity {
		n.affinity[ns] = newAffinityTable(min(c.MaxAffinity, 1<<12))
	}
	n.up.Store(true)
	return n, nil
}

// ID returns the Node's sender id.
func (n *Node) ID() uint64 { return n.id }

// Stats returns the Node's counters.
func (n *Node) Stats() *Stats { return &n.stats }

// SetUp records whether the bus carries this replica's records (Plane sets it from the
// connection). While it is down, Active is false: the routing reads nothing from peers.
func (n *Node) SetUp(up bool) { n.up.Store(up) }

// Active reports whether the routing should read the peers' views: the bus is up, and some peer
// is heard or none ever was (alone on a live bus S is this replica's own). A replica that heard
// peers and then none (partitioned from them, or they all left) is not Active: it routes on
// estimates again, as without sync, until a peer is heard.
func (n *Node) Active() bool {
	if !n.up.Load() {
		return false
	}
	if !n.heardPeer.Load() {
		return true
	}
	// Counting live peers walks the peer table: decisions read a count at most activeEvery old.
	now := n.cfg.Now().UnixNano()
	if at := n.activeAt.Load(); now-at < int64(activeEvery) && now >= at {
		return n.activeVal.Load()
	}
	live := n.Peers() > 0
	n.activeVal.Store(live)
	n.activeAt.Store(now)
	return live
}

// activeEvery is how long Active reuses its count of live peers.
const activeEvery = 50 * time.Millisecond

// hashID is a request id's keyed hash (0 for none).
func (n *Node) hashID(id string) uint64 {
	if id == "" {
		return 0
	}
	return n.chain.next(0x72657169, bytesOf(id))
}

// Decided records that this replica sent model's prompt with routing text to worker, with
// uncached tokens of it missing the worker's cache.
func (n *Node) Decided(model, worker, text, reqID string, uncached float64) {
	var sb [64]uint64
	bounds, whole := n.chain.Boundaries(sb[:0], text)
	n.DecidedChain(model, worker, bounds, whole, reqID, uncached)
}

// Chain appends to dst the chain of text's chunk hashes under the cluster's key (bounds[i]
// covers its first (i+1)×ChunkBytes bytes) and returns it with the hash of the whole text (0
// when text is a whole number of chunks): what PlacedChain looks up and DecidedChain publishes,
// so that a decision hashes its routing text once.
func (n *Node) Chain(dst []uint64, text string) (bounds []uint64, whole uint64) {
	return n.chain.Boundaries(dst, text)
}

// DecidedChain is Decided for a text already hashed by Chain (bounds and whole as it
// returned them).
func (n *Node) DecidedChain(model, worker string, bounds []uint64, whole uint64, reqID string, uncached float64) {
	var hb [64]uint64
	hashes := sampledOf(hb[:0], bounds, whole)
	u := uint64(0)
	if uncached > 0 {
		u = uint64(min(uncached, MaxUncached))
	}
	rid := n.hashID(reqID)
	n.omu.Lock()
	n.room()
	n.out = AppendDecision(n.out, model, worker, rid, u, hashes)
	n.records++
	n.omu.Unlock()
	if n.notify != nil {
		n.notify()
	}
}

// Finished records that a request this replica sent worker ended (answered, failed or
// cancelled).
func (n *Node) Finished(model, worker, reqID string) {
	rid := n.hashID(reqID)
	n.omu.Lock()
	n.room()
	n.out = AppendFinish(n.out, model, worker, rid)
	n.records++
	n.omu.Unlock()
	if n.notify != nil {
		n.notify()
	}
}

// Bound records that key (a response id, NSResponse, or a session key, NSSession) of model is
// held by worker; peers answer Affinity for it.
func (n *Node) Bound(ns byte, key, model, worker string) {
	k := n.keyHash(ns, key)
	n.omu.Lock()
	n.room()
	n.out = AppendAffinity(n.out, ns, k, model, worker)
	n.records++
	n.omu.Unlock()
	if n.notify != nil {
		n.notify()
	}
}

func (n *Node) keyHash(ns byte, key string) uint64 {
	return n.chain.next(uint64(ns)<<56|0x6166, bytesOf(key))
}

// room makes room for one more record in the batch being built, starting one; n.omu is held.
func (n *Node) room() {
	if n.records > 0 && len(n.out)+MaxRecordBytes > MaxBatchBytes {
		n.seal()
	}
	if n.records == 0 && len(n.out) == 0 {
		n.out = n.buffer()
		n.seq++
		n.out = AppendHeader(n.out, Header{Sender: n.id, Seq: n.seq})
	}
}

// seal moves the batch being built to ready, dropping the oldest ready batch past MaxPending.
func (n *Node) seal() {
	if len(n.ready) >= n.cfg.MaxPending {
		n.free = append(n.free, n.ready[0][:0])
		n.ready = append(n.ready[:0], n.ready[1:]...)
		n.stats.Dropped.Add(1)
	}
	n.ready = append(n.ready, n.out)
	n.out, n.records = nil, 0
}

func (n *Node) buffer() []byte {
	if k := len(n.free); k > 0 {
		b := n.free[k-1]
		n.free = n.free[:k-1]
		return b[:0]
	}
	return make([]byte, 0, 4096)
}

// Pending reports whether a batch is waiting for Flush.
func (n *Node) Pending() bool {
	n.omu.Lock()
	defer n.omu.Unlock()
	return n.records > 0 || len(n.ready) > 0
}

// Flush calls publish with every batch waiting, oldest first, and with a heartbeat when nothing
// was published for Heartbeat; it returns the first error of publish (the batches after it stay
// pending). The batch is valid only during the call.
func (n *Node) Flush(publish func([]byte) error) error {
	n.omu.Lock()
	defer n.omu.Unlock()
	if n.records > 0 {
		n.seal()
	}
	now := n.cfg.Now()
	if len(n.ready) == 0 && now.Sub(n.lastOut) >= n.cfg.Heartbeat {
		n.seq++
		n.ready = append(n.ready, AppendHeader(n.buffer(), Header{Sender: n.id, Seq: n.seq}))
	}
	done := 0
	var err error
	for _, b := range n.ready {
		if err = publish(b); err != nil {
			break
		}
		n.free = append(n.free, b[:0])
		n.stats.Published.Add(1)
		n.lastOut = now
		done++
	}
	clear(n.ready[copy(n.ready, n.ready[done:]):])
	n.ready = n.ready[:len(n.ready)-done]
	return err
}

// Discard drops every record not yet published (Plane: what was recorded while the bus was
// down).
func (n *Node) Discard() {
	n.omu.Lock()
	defer n.omu.Unlock()
	for _, b := range n.ready {
		n.free = append(n.free, b[:0])
	}
	n.stats.Dropped.Add(uint64(len(n.ready)))
	clear(n.ready)
	n.ready = n.ready[:0]
	if n.out != nil {
		n.free = append(n.free, n.out[:0])
		n.out, n.records = nil, 0
		n.stats.Dropped.Add(1)
	}
}
