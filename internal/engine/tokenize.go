package engine

// The engine's tokenizer is deterministic and content-addressed: token i of a text is a 32-bit
// multiplicative hash of bytes [4i, 4i+4) and their count (the last token may cover fewer
// bytes). So a text of n bytes is
// ceil(n/4) tokens — close to the usual "about 4 characters per token" of BPE tokenizers on
// English — the same text always gives the same tokens, and two texts that share their first 4k
// bytes share their first k tokens, which is what prefix caching needs.

// BytesPerToken is the number of text bytes one token covers.
const BytesPerToken = 4

const (
	golden      = 0x9e3779b97f4a7c15 // 2^64 / φ, odd: multiplying by it is a bijection
	fnv64Offset = 14695981039346656037
)

// TokenCount returns the number of tokens Tokenize(text) returns, without allocating.
func TokenCount(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

// Tokenize returns the tokens of text (see the package doc). The empty text has no tokens.
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, TokenCount(text)), text)
}

// AppendTokens appends the tokens of text to dst and returns the extended slice.
func AppendTokens(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); i += BytesPerToken {
		end := min(i+BytesPerToken, len(text))
		dst = append(dst, tokenOf(text[i:end]))
	}
	return dst
}

// tokenOf hashes one chunk of at most BytesPerToken bytes: the bytes and their count packed in
// a word, multiplied by an odd constant, the high half kept.
func tokenOf(chunk string) uint32 {
	if len(chunk) == 4 {
		return token4(chunk[0], chunk[1], chunk[2], chunk[3])
	}
	w := uint64(len(chunk)) << 32
	for j := 0; j < len(chunk); j++ {
		w |= uint64(chunk[j]) << (8 * j)
	}
	return uint32(w * golden >> 32)
}

// token4 is tokenOf of a whole 4-byte chunk.
func token4(b0, b1, b2, b3 byte) uint32 {
	w := 4<<32 | uint64(b0) | uint64(b1)<<8 | uint64(b2)<<16 | uint64(b3)<<24
	return uint32(w * golden >> 32)
}

// chainKey folds a word into a running block key: a multiply-xorshift step. Each step is a
// bijection of the key for a given word and of the word for a given key; steps depend on each
// other, so the chain's latency (about six cycles a step) bounds keying. The words are token
// pairs, which halves the chain's length.
func chainKey(h, w uint64) uint64 {
	h = (h ^ w) * golden
	return h ^ h>>29
}

// pair packs two tokens in one word for chainKey.
func pair(a, b uint32) uint64 { return uint64(a) | uint64(b)<<32 }

// blockEnd marks a block boundary in the chain, so that keys depend on the block size too.
const blockEnd = 0xffffffff

// blockKeys returns the keys of the full blocks of a prompt given by its tokens. Key j covers
// tokens [0, (j+1)·bs): it chains over the whole prefix, so a block matches only when every block
// before it matches too. Within a block, tokens are chained in pairs (a lone last token when bs
// is odd).
func blockKeys(dst []uint64, toks []uint32, bs int) []uint64 {
	h := uint64(fnv64Offset)
	for i := 0; i+bs <= len(toks); i += bs {
		blk := toks[i : i+bs]
		j := 0
		for ; j+1 < len(blk); j += 2 {
			h = chainKey(h, pair(blk[j], blk[j+1]))
		}
		if j < len(blk) {
			h = chainKey(h, uint64(blk[j]))
		}
		h = chainKey(h, blockEnd)
		dst = append(dst, h)
	}
	return dst
}

// blockKeysText is blockKeys(Tokenize(text)) without materializing the tokens: blocks of whole
// 4-byte tokens are hashed eight bytes at a time, only a block holding the text's short last
// token takes the general path.
func blockKeysText(dst []uint64, text string, bs int) []uint64 {
	h := uint64(fnv64Offset)
	step := bs * BytesPerToken
	blocks := TokenCount(text) / bs
	for k := range blocks {
		blk := text[k*step : min((k+1)*step, len(text))]
		j := 0
		if len(blk) == step {
			for ; j+8 <= len(blk); j += 8 {
				c := blk[j : j+8]
				h = chainKey(h, pair(token4(c[0], c[1], c[2], c[3]), token4(c[4], c[5], c[6], c[7])))
			}
		} else {
			for ; j+BytesPerToken < len(blk); j += 2 * BytesPerToken {
				a := tokenOf(blk[j : j+BytesPerToken])
				b := tokenOf(blk[j+BytesPerToken : min(j+2*BytesPerToken, len(blk))])
				h = chainKey(h, pair(a, b))
			}
		}
		if j < len(blk) {
			h = chainKey(h, uint64(tokenOf(blk[j:])))
		}
		h = chainKey(h, blockEnd)
		dst = append(dst, h)
	}
	return dst
}

// BlockKeys appends to dst the prefix-cache keys of the full blocks of text, for blocks of
// blockSize tokens, exactly as an engine with that block size keys them, and returns the
// extended slice. Two texts share their first j keys exactly when they share their first j
// blocks of tokens.
func BlockKeys(dst []uint64, text string, blockSize int) []uint64 {
	return blockKeysText(dst, text, blockSize)
}
