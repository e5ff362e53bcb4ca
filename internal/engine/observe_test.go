package engine

import (
	"slices"
	"testing"
	"time"
)

// mirror rebuilds the prefix cache from observer calls alone.
type mirror struct {
	t       *testing.T
	blocks  map[uint64][]uint32
	last    time.Duration
	clears  int
	removed int
}

func (m *mirror) BlockStored(at time.Duration, key, parent uint64, hasParent bool, toks []uint32) {
	if at < m.last {
		m.t.Errorf("stored at %v after an event at %v", at, m.last)
	}
	m.last = at
	if _, ok := m.blocks[key]; ok {
		m.t.Errorf("block %x stored twice", key)
	}
	m.blocks[key] = slices.Clone(toks)
}

func (m *mirror) BlockRemoved(at time.Duration, key uint64) {
	m.last = max(m.last, at)
	if _, ok := m.blocks[key]; !ok {
		m.t.Errorf("removed block %x that was never stored", key)
	}
	delete(m.blocks, key)
	m.removed++
}

func (m *mirror) CacheCleared(at time.Duration) {
	m.last = max(m.last, at)
	clear(m.blocks)
	m.clears++
}

// The observer sees exactly the blocks the cache holds, with their tokens and chained keys, and
// hears of every eviction: a small cache under many distinct prompts evicts constantly.
func TestCacheObserverMirrorsTheCache(t *testing.T) {
	e := mustNew(t, Config{BlockSize: 4, KVTokens: 32 * 4, MaxRunning: 4})
	m := &mirror{t: t, blocks: map[uint64][]uint32{}}
	e.SetCacheObserver(m)
	for i := range 40 {
		p := text(string(rune('a'+i%13)), 30+i%5)
		if i%3 == 0 {
			mustSubmit(t, e, e.Now(), Request{ID: uint64(i), Tokens: Tokenize(p), MaxTokens: 3})
		} else {
			mustSubmit(t, e, e.Now(), Request{ID: uint64(i), Text: p, MaxTokens: 3})
		}
		drain(t, e, 10000)
		if len(m.blocks) != e.cache.cached() {
			t.Fatalf("after request %d the observer saw %d blocks, the cache holds %d", i, len(m.blocks), e.cache.cached())
		}
		// Every block the observer knows is in the cache, under the key its tokens chain to.
		keys := blockKeys(nil, Tokenize(p), 4)
		for j, k := range keys[:min(len(keys), 7)] {
			if toks, ok := m.blocks[k]; ok && !slices.Equal(toks, Tokenize(p)[j*4:(j+1)*4]) {
				t.Fatalf("block %d of request %d: tokens %v", j, i, toks)
			}
		}
	}
	if m.removed == 0 {
		t.Fatal("the workload never evicted: the test proves nothing")
	}
	e.FlushCache(e.Now())
	if len(m.blocks) != 0 || m.clears != 1 {
		t.Fatalf("after a flush the observer holds %d blocks, %d clears", len(m.blocks), m.clears)
	}
}
