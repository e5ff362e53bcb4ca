package engine

import (
	"testing"
	"time"
)

// saltObs records the salts told before each first block.
type saltObs struct {
	salts  []string
	stored int
}

func (o *saltObs) StoredSalt(s string) { o.salts = append(o.salts, s) }
func (o *saltObs) BlockStored(_ time.Duration, _, _ uint64, hasParent bool, _ []uint32) {
	if !hasParent {
		o.stored++
	}
}
func (o *saltObs) BlockRemoved(time.Duration, uint64) {}
func (o *saltObs) CacheCleared(time.Duration)         {}

// TestSaltedPromptsShareNoCache: the same prompt (all of it cached but the last token, when it is) under another salt, or none, is not a cache hit;
// under its own salt it is; and an observer is told the salt of a salted prompt's first block.
func TestSaltedPromptsShareNoCache(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	obs := &saltObs{}
	e.SetCacheObserver(obs)
	p := text("salted", 320)
	for i, tc := range []struct {
		salt   string
		cached int
	}{{"a", 0}, {"a", 319}, {"b", 0}, {"", 0}, {"b", 319}} {
		id := uint64(i + 1)
		mustSubmit(t, e, e.Now(), Request{ID: id, Text: p, MaxTokens: 1, Salt: tc.salt})
		fin, _ := find(drain(t, e, 100), Finished, id)
		if fin.CachedTokens != tc.cached {
			t.Fatalf("request %d (salt %q): cached %d, want %d", id, tc.salt, fin.CachedTokens, tc.cached)
		}
	}
	if len(obs.salts) != 2 || obs.salts[0] != "a" || obs.salts[1] != "b" {
		t.Fatalf("salts told %v, want [a b] (each stored once)", obs.salts)
	}
}
