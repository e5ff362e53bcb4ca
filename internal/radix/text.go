package radix

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
	"unsafe"
)

// The tree is keyed by bytes but cut only between characters. A character ("unit") is one valid
// UTF-8 encoded rune, or one byte that does not start a valid encoding (each such byte counts as
// one character, exactly as utf8.RuneCountInString counts it). Edges therefore always hold whole
// characters, sizes and match lengths are in characters, and a multi-byte rune is never split
// between two nodes, whatever bytes the caller sends.

// unitKey returns the child key of s (which must be non-empty): its first rune, or −1−b for an
// invalid leading byte b, so that distinct first characters never share a key.
func unitKey(s string) int32 {
	if c := s[0]; c < utf8.RuneSelf {
		return int32(c)
	}
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n == 1 {
		return -1 - int32(s[0])
	}
	return r
}

// commonPrefix returns the length in bytes of the longest common prefix of a and b that ends on
// a character boundary of both.
func commonPrefix(a, b string) int {
	i := commonBytes(a, b)
	if i == len(a) && i == len(b) {
		return i
	}
	// i is a boundary unless a valid rune that starts in the common part runs across it, in a or
	// in b. Such a rune starts at most 3 bytes back, at a byte that is not a continuation byte.
	for k := i - 1; k >= 0 && k >= i-(utf8.UTFMax-1); k-- {
		if !utf8.RuneStart(a[k]) {
			continue
		}
		if covers(a, k, i) || covers(b, k, i) {
			return k
		}
		break
	}
	return i
}

// covers reports whether s holds a valid rune starting at k that extends past byte i.
func covers(s string, k, i int) bool {
	if s[k] < utf8.RuneSelf {
		return false
	}
	r, n := utf8.DecodeRuneInString(s[k:])
	return !(r == utf8.RuneError && n == 1) && k+n > i
}

// commonBytes returns the length of the longest common byte prefix of a and b, comparing 64 and
// then eight bytes at a time: the 8 KB prompts the gateway matches make this the hottest loop of
// a decision.
func commonBytes(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && a[i:i+64] == b[i:i+64] { // runtime memequal: vectorized
		i += 64
	}
	for ; i+8 <= n; i += 8 {
		if d := load64(a, i) ^ load64(b, i); d != 0 {
			return i + bits.TrailingZeros64(d)/8
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// charCount returns the number of characters in s: utf8.RuneCountInString(s), with a fast path
// for ASCII runs, 32 bytes at a time (prompt text is mostly ASCII and every decision counts the
// whole text).
func charCount(s string) int {
	const hi = 0x8080808080808080
	n, i := 0, 0
	for i+32 <= len(s) {
		if (load64(s, i)|load64(s, i+8)|load64(s, i+16)|load64(s, i+24))&hi == 0 {
			n, i = n+32, i+32
			continue
		}
		end := i + 32
		for i < end {
			if s[i] < utf8.RuneSelf {
				n, i = n+1, i+1
				continue
			}
			_, size := utf8.DecodeRuneInString(s[i:])
			n, i = n+1, i+size
		}
	}
	return n + utf8.RuneCountInString(s[i:])
}

// load64 returns the eight bytes of s at i (which must be in range) as a little-endian word.
func load64(s string, i int) uint64 {
	return binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.StringData(s)), i)), 8))
}
