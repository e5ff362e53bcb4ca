package engine

import "time"

// CacheObserver is told of every change to an engine's prefix cache, in order, when it happens:
// what a real engine reports as KV-cache events (vLLM's BlockStored / BlockRemoved). A block's key is its hash: it
// chains over every token before it, so a block is identified by its whole prefix.
// Implementations must not call back into the engine.
type CacheObserver interface {
	// BlockStored: the block of key entered the cache. parent is the key of the block before
	// it in its prompt (hasParent is false for a prompt's first block); tokens are the block's
	// token ids, valid only during the call.
	BlockStored(at time.Duration, key, parent uint64, hasParent bool, tokens []uint32)
	// BlockRemoved: the block of key was evicted.
	BlockRemoved(at time.Duration, key uint64)
	// CacheCleared: every cached block was dropped at once (a flush with nothing pinned).
	CacheCleared(at time.Duration)
}

// SetCacheObserver makes o receive the prefix cache's changes from now on; nil stops it. Set it
// before submitting requests: a request already queued is not reported when its blocks are
// stored. With no observer the engine pays nothing for this (the prompt's tokens are not kept).
func (e *Engine) SetCacheObserver(o CacheObserver) { e.cache.obs = o }

// stored reports block j of r's prompt as stored.
func (e *Engine) stored(r *req, j int) {
	bs := e.cfg.BlockSize
	if len(r.toks) < (j+1)*bs {
		return // queued before the observer was set
	}
	var parent uint64
	if j > 0 {
		parent = r.keys[j-1]
	}
	if j == 0 && r.salt != "" {
		if so, ok := e.cache.obs.(SaltObserver); ok {
			so.StoredSalt(r.salt)
		}
	}
	if r.adapter != "" {
		if ao, ok := e.cache.obs.(AdapterObserver); ok {
			ao.StoredAdapter(r.adapter) // lora.go
		}
	}
	e.cache.obs.BlockStored(e.cache.at, r.keys[j], parent, j > 0, r.toks[j*bs:(j+1)*bs])
}
