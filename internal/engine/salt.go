package engine

// Cache salts. vLLM keys a salted prompt's blocks apart from every other salt's (the salt is one
// of the first block's hash inputs, and every later block's hash chains over it): requests with
// different salts never share a cached block, whatever their tokens. The engine does the same
// by mixing a hash of the salt into every block key of a salted prompt; an unsalted prompt's keys
// are unchanged.

// SaltObserver is a CacheObserver that is also told the salt of a salted prompt whose first block
// is stored, just before BlockStored reports it (vLLM's BlockStored carries it among the
// block's extra_keys).
type SaltObserver interface {
	StoredSalt(salt string)
}

// saltKeys mixes salt into each of keys in place; "" leaves them.
func saltKeys(keys []uint64, salt string) {
	if salt == "" {
		return
	}
	h := uint64(fnv64Offset)
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * 1099511628211
	}
	h = chainKey(h, blockEnd)
	for i := range keys {
		keys[i] = chainKey(keys[i], h)
	}
}
