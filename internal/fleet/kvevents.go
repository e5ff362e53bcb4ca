package fleet

import (
	"cmp"
	"context"
	"errors"
	"hash/maphash"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// KVEvents configures engine KV-cache events in the simulator, for precise_prefix: every engine
// reports each block stored and evicted as it happens (its engine.CacheObserver), every gateway
// replica receives the report Delay later into its own kvevents.Index, and a replica pays a
// tokenization for each prompt its tokenizer cache does not hold. The zero value takes the
// defaults.
type KVEvents struct {
	// Delay is the time from an engine's cache change to every replica's index. Default 5 ms
	// (a ZeroMQ hop plus the engine's batching of events per step).
	Delay time.Duration
	// TokenizeBase is the fixed cost of one tokenization by a worker's /tokenize (an HTTP round
	// trip). Default 1 ms.
	TokenizeBase time.Duration
	// TokenizeTPS is the tokenizer's speed in tokens per second. Default 2e6 (a fast Rust
	// tokenizer on one core).
	TokenizeTPS float64
	// TokenizerCache is the prompts each replica's tokenizer cache holds. Default 4096.
	TokenizerCache int
}

func (k KVEvents) withDefaults() KVEvents {
	k.Delay = cmp.Or(k.Delay, 5*time.Millisecond)
	k.TokenizeBase = cmp.Or(k.TokenizeBase, time.Millisecond)
	k.TokenizeTPS = cmp.Or(k.TokenizeTPS, 2e6)
	k.TokenizerCache = cmp.Or(k.TokenizerCache, 4096)
	return k
}

// Validate reports an invalid field.
func (k KVEvents) Validate() error {
	if k.Delay < 0 || k.TokenizeBase < 0 || k.TokenizeTPS < 0 || k.TokenizerCache < 0 {
		return errors.New("fleet: kv events delay and tokenizer costs must not be negative")
	}
	return nil
}

// preciseNames are the policies that read KV-cache events.
func usesEvents(policyName string) bool {
	n, _ := canonical(policyName)
	return n == "precise_prefix"
}

// kvRecord is one block change waiting to be delivered.
type kvRecord struct {
	at  time.Duration
	eng int
	ev  kvevents.Event
}

// kvFeed is the stream of every engine's cache changes, which every replica reads at its own
// cursor; records every cursor has passed are dropped.
type kvFeed struct {
	cfg     KVEvents
	recs    []kvRecord
	base    int // absolute index of recs[0]
	readers []*replicaKV
	// adapter is the LoRA adapter of the block stored next (kvevents_lora.go).
	adapter string
}

// engineEvents is engine eng's observer.
type engineEvents struct {
	f   *kvFeed
	eng int
}

func (o engineEvents) BlockStored(at time.Duration, key, parent uint64, hasParent bool, toks []uint32) {
	o.f.recs = append(o.f.recs, kvRecord{at, o.eng, kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{key},
		Parent: parent, HasParent: hasParent, Tokens: append([]uint32(nil), toks...), BlockSize: len(toks), LoRAName: o.f.adapter}})
	o.f.adapter = ""
}

func (o engineEvents) BlockRemoved(at time.Duration, key uint64) {
	o.f.recs = append(o.f.recs, kvRecord{at, o.eng, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{key}}})
}

func (o engineEvents) CacheCleared(at time.Duration) {
	o.f.recs = append(o.f.recs, kvRecord{at, o.eng, kvevents.Event{Kind: kvevents.AllBlocksCleared}})
}

var _ engine.CacheObserver = engineEvents{}

// newKVFeed makes every engine of s report to a new feed.
func newKVFeed(s *sim) *kvFeed {
	f := &kvFeed{cfg: s.cfg.KVEvents.withDefaults()}
	for i, se := range s.engines {
		se.e.SetCacheObserver(engineEvents{f, i})
	}
	return f
}

// trim drops the records every reader has applied.
func (f *kvFeed) trim() {
	low := f.base + len(f.recs)
	for _, r := range f.readers {
		low = min(low, r.cursor)
	}
	if n := low - f.base; n > 4096 && n > len(f.recs)/2 {
		f.recs = append(f.recs[:0], f.recs[n:]...)
		f.base = low
	}
}

// replicaKV is one gateway replica's event index and tokenizer: the policy.KVView its
// precise_prefix reads.
type replicaKV struct {
	g      *gateway
	feed   *kvFeed
	idx    *kvevents.Index
	cursor int
	srcs   []kvevents.Source

	seed  maphash.Seed
	cache map[uint64]struct{} // prompts tokenized; cleared when full
	// prompt is the whole prompt of the request being routed (the policy sees its routing
	// prefix); cost is the tokenization cost of the last pick, taken by the request it routed.
	prompt string
	cost   time.Duration
}

var _ policy.KVView = (*replicaKV)(nil)

// newReplicaKV subscribes replica g to the feed. Every engine's stream is known from the start
// (its index is empty and trusted), as a replica dialing every engine's publisher would have it.
func newReplicaKV(g *gateway, f *kvFeed) *replicaKV {
	r := &replicaKV{g: g, feed: f, idx: kvevents.NewIndex(1<<22, 1), cursor: f.base + len(f.recs),
		seed: maphash.MakeSeed(), cache: map[uint64]struct{}{}}
	for _, w := range g.workers {
		src := kvevents.Source{Worker: w.ID, Model: simModel}
		r.srcs = append(r.srcs, src)
		r.idx.Expect(src)
	}
	f.readers = append(f.readers, r)
	return r
}

// deliver applies every change that reached this replica by now.
func (r *replicaKV) deliver() {
	f, now := r.feed, r.g.s.now
	for r.cursor < f.base+len(f.recs) {
		rec := &f.recs[r.cursor-f.base]
		if rec.at+f.cfg.Delay > now {
			break
		}
		r.idx.Apply(r.srcs[rec.eng], []kvevents.Event{rec.ev})
		r.cursor++
	}
	f.trim()
}

// Tokenize tokenizes the whole prompt as the engines do and charges the replica's tokenization
// cost unless its cache holds the prompt.
func (r *replicaKV) Tokenize(_ context.Context, _ *worker.Worker, _ string, _ bool, _ []byte, _ string) ([]uint32, error) {
	text := r.prompt
	toks := engine.Tokenize(text)
	h := maphash.String(r.seed, text)
	if _, ok := r.cache[h]; !ok {
		c := r.feed.cfg
		r.cost = c.TokenizeBase + time.Duration(float64(len(toks))/c.TokenizeTPS*float64(time.Second))
		if len(r.cache) >= c.TokenizerCache {
			clear(r.cache)
		}
		r.cache[h] = struct{}{}
	}
	return toks, nil
}

// Covers is the replica index's Covers.
func (r *replicaKV) Covers(model string, ids []string) bool {
	return r.idx.Covers(model, ids, epoch.Add(r.g.s.now))
}

// Match is the replica index's Match, after delivering what is due.
func (r *replicaKV) Match(model string, toks []uint32, ids []string, out []int) bool {
	r.deliver()
	return r.idx.Match(model, toks, ids, out, epoch.Add(r.g.s.now))
}

// CoversAny is the replica index's CoversAny.
func (r *replicaKV) CoversAny(model string, ids []string) bool {
	return r.idx.CoversAny(model, ids, epoch.Add(r.g.s.now))
}

// MatchEach is the replica index's MatchEach, after delivering what is due.
func (r *replicaKV) MatchEach(model string, toks []uint32, ids []string, out []int) int {
	r.deliver()
	return r.idx.MatchEach(model, toks, ids, out, epoch.Add(r.g.s.now))
}

// takeCost returns the last pick's tokenization cost and resets it.
func (r *replicaKV) takeCost() time.Duration {
	c := r.cost
	r.cost = 0
	return c
}
