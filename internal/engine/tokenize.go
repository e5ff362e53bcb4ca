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
	w := uint64(len(chunk)) << 32
	if len(chunk) == 4 {
		w |= uint64(chunk[0]) | uint64(chunk[1])<<8 | uint64(chunk[2])<<16 | uint64(chunk[3])<<24
	} else {
		for j := 0; j < len(chunk); j++ {
			w |= uint64(chunk[j]) << (8 * j)
		}
	}
	return uint32(w * golden >> 32)
}

// chainKey folds one token into a running block key: a multiply-xorshift step, one multiply per
// token (the key is hashed once per prompt token, the model's hottest loop).
func chainKey(h uint64, tok uint32) uint64 {
	h = (h ^ uint64(tok)) * golden
	return h ^ h>>29
}

// blockKeys returns the keys of the full blocks of a prompt given by its tokens. Key j covers
// tokens [0, (j+1)·bs): it chains over the whole prefix, so a block matches only when every block
// before it matches too.
func blockKeys(dst []uint64, toks []uint32, bs int) []uint64 {
	h := uint64(fnv64Offset)
	for i := 0; i+bs <= len(toks); i += bs {
		for _, t := range toks[i : i+bs] {
			h = chainKey(h, t)
		}
		// Mark the block boundary so that keys depend on the block size too.
		h = chainKey(h, 0xffffffff)
		dst = append(dst, h)
	}
	return dst
}

// blockKeysText is blockKeys(Tokenize(text)) without materializing the tokens.
func blockKeysText(dst []uint64, text string, bs int) []uint64 {
	h := uint64(fnv64Offset)
	n := 0
	full := TokenCount(text) / bs * bs
	for i := 0; n < full; i += BytesPerToken {
		h = chainKey(h, tokenOf(text[i:min(i+BytesPerToken, len(text))]))
		n++
		if n%bs == 0 {
			h = chainKey(h, 0xffffffff)
			dst = append(dst, h)
		}
	}
	return dst
}
