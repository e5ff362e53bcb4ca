package replicasync

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
)

// ChunkBytes is the size of the routing-text chunks whose chained hashes stand for a placed
// prefix, in bytes (64 tokens at about 4 bytes a token). Peers match a prefix to within one
// chunk.
const ChunkBytes = 256

// Chainer hashes routing text into chained chunk hashes keyed by the cluster's secret: the hash
// of chunk i covers chunks 0..i, so one hash stands for a whole prefix, and two replicas that
// share the key compute the same hashes for the same text. Without the key a hash says nothing
// about the text; with it, only whether two prefixes are equal. It is a fast keyed mix (a
// multiply-fold construction), not a MAC: the bus's own authentication keeps strangers off it.
// The zero value hashes with a zero key.
type Chainer struct{ k0, k1 uint64 }

// NewChainer returns the Chainer for a cluster key (any bytes; empty for an unkeyed loopback
// cluster).
func NewChainer(key []byte) Chainer {
	sum := sha256.Sum256(append([]byte("kvgate replica sync chain v1\x00"), key...))
	return Chainer{k0: binary.LittleEndian.Uint64(sum[:]), k1: binary.LittleEndian.Uint64(sum[8:])}
}

func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// next chains the hash of p onto prev.
func (c Chainer) next(prev uint64, p []byte) uint64 {
	h := prev ^ c.k0
	for len(p) >= 16 {
		h = mum(binary.LittleEndian.Uint64(p)^c.k1^h, binary.LittleEndian.Uint64(p[8:])^c.k0)
		p = p[16:]
	}
	if len(p) > 0 {
		var tail [16]byte
		copy(tail[:], p)
		h = mum(binary.LittleEndian.Uint64(tail[:])^c.k1^h, binary.LittleEndian.Uint64(tail[8:])^c.k0^uint64(len(p)))
	}
	return mum(h^c.k1, c.k0|1)
}

// whole is the hash of the whole text from the chain over its full chunks (prev) and its tail:
// distinct from every chunk boundary's hash, so a text that is not a whole number of chunks is
// matched whole only by the same text.
func (c Chainer) whole(prev uint64, tail []byte, n int) uint64 {
	return mum(c.next(prev, tail)^uint64(n)^0xa5a5a5a5a5a5a5a5, c.k1|1)
}

// Boundaries appends to dst the chain's hash at every chunk boundary of text (dst[i] covers the
// first (i+1)×ChunkBytes bytes) and returns it with the hash of the whole text (0 when text is
// a whole number of chunks, whose last boundary is the whole).
func (c Chainer) Boundaries(dst []uint64, text string) ([]uint64, uint64) {
	var h uint64
	b := bytesOf(text)
	for len(b) >= ChunkBytes {
		h = c.next(h, b[:ChunkBytes])
		dst = append(dst, h)
		b = b[ChunkBytes:]
	}
	if len(b) == 0 {
		return dst, 0
	}
	return dst, c.whole(h, b, len(text))
}

// sampled reports whether chunk boundary i (0-based: the first i+1 chunks) is published: two a
// doubling (1, 2, 3, 4, 6, 8, 12, 16, 24, … chunks), so a peer's prefix is matched to within a
// third of its length, with the longest always published.
func sampled(i int) bool {
	n := uint(i + 1)
	if n <= 4 {
		return true
	}
	hi := bits.Len(n) - 1 // n in [2^hi, 2^(hi+1))
	return n == 1<<hi || n == 3<<(hi-1)
}

// Sampled appends the hashes a decision for text publishes: the sampled boundaries, the last
// boundary and the whole text, at most MaxHashes (the shortest dropped first). scratch holds
// the boundaries; both are returned for reuse.
func (c Chainer) Sampled(dst, scratch []uint64, text string) (hashes, boundaries []uint64) {
	bounds, whole := c.Boundaries(scratch[:0], text)
	return sampledOf(dst, bounds, whole), bounds
}

// sampledOf appends the hashes a decision publishes from its text's chain (Boundaries's
// bounds and whole): the sampled boundaries, the last and the whole, at most MaxHashes.
func sampledOf(dst, bounds []uint64, whole uint64) []uint64 {
	for i, h := range bounds {
		if sampled(i) || i == len(bounds)-1 {
			dst = append(dst, h)
		}
	}
	if whole != 0 {
		dst = append(dst, whole)
	}
	if len(dst) > MaxHashes {
		dst = append(dst[:0], dst[len(dst)-MaxHashes:]...)
	}
	return dst
}
