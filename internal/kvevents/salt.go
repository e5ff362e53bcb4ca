package kvevents

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Cache salts. vLLM folds a request's cache_salt into the hash of its prompt's first block, as
// one of that block's extra keys (with the adapter's name and the multimodal identifiers of
// what the block covers), so requests with different salts never share a block; and newer
// vLLM's BlockStored events carry those keys ("extra_keys", one tuple or nil per block). The index keys blocks by token ids, chained from a seed: the equivalent is to mix the
// first block's extra keys into the seed of a chain that starts a prompt. A request's lookup
// mixes its salt alike (MatchSalted), so a salted prompt meets only its salt's blocks, and an
// unsalted one none of them. Every string key other than the adapter's name is mixed, in
// order: a block with multimodal identifiers is keyed apart too, which a text lookup cannot
// reach (its placeholder tokens would otherwise match any other image's). Streams without
// extra_keys (older vLLM, SGLang) key every chain unsalted, as before.

// SaltDigest is the identity of a cache salt in the index and in the routing text: the first 8
// bytes of its SHA-256, the same on every replica, and one-way, so that what the index and the
// prefix trees hold gives no salt back.
func SaltDigest(salt []byte) uint64 {
	sum := sha256.Sum256(salt)
	return binary.BigEndian.Uint64(sum[:8])
}

// saltSeed returns the chain seed seed with the salt digest mixed in.
func saltSeed(seed, salt uint64) uint64 { return mix(seed, salt) }

// extraKeys reads a BlockStored's "extra_keys" and returns the string keys of its first block
// (nil when there are none); the other blocks' keys are skipped.
func (d *decoder) extraKeys() ([]string, error) {
	var keys []string
	block := 0
	err := d.elements(func(c byte) error {
		if block++; block > 1 || !isArray(c) {
			return d.skip(1)
		}
		return d.elements(func(c byte) error {
			if !isStr(c) {
				return d.skip(2)
			}
			s, err := d.str()
			keys = append(keys, s)
			return err
		})
	})
	return keys, err
}

// elements reads an array (nil: an empty one), calling fn with the first byte of each element;
// fn consumes the element.
func (d *decoder) elements(fn func(c byte) error) error {
	if null, err := d.isNil(); null || err != nil {
		return err
	}
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		c, err := d.peek()
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// saltOf sets e's salt from the string extra keys of its first block: every key but the first
// equal to the adapter's name, mixed in order. Only a chain that starts a prompt carries one.
func (e *Event) saltOf() {
	keys := e.ExtraKeys
	if e.HasParent || len(keys) == 0 {
		return
	}
	var h uint64
	lora := e.LoRAName != ""
	for _, k := range keys {
		if lora && k == e.LoRAName {
			lora = false
			continue
		}
		if !e.Salted {
			h, e.Salted = SaltDigest([]byte(k)), true
			continue
		}
		h = mix(h, SaltDigest([]byte(k)))
	}
	e.Salt = h
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isStr(c byte) bool { return msgpcode.IsString(c) || msgpcode.IsBin(c) }

// optStr reads nil (as "") or a string.
func (d *decoder) optStr() (string, error) {
	if null, err := d.isNil(); null || err != nil {
		return "", err
	}
	return d.str()
}
