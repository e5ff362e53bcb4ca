package policy

import (
	"encoding/binary"
	"encoding/hex"
)

// Cache salts (vLLM's cache_salt) in routing: requests with different salts never share an
// engine's prefix cache, so a salt is part of a prefix's identity. The routing text of a salted
// request opens with a fixed-length mark of its salt's digest (SaltedText): each salt's prefixes
// then live apart in the prefix trees, and the placement key, cut from the routing text, differs
// by salt. The engines' KV events key a salted chain by its salt (kvevents), which precise
// routing looks up through SaltedMatcher.

// SaltedMatcher is implemented by a KVView that keys chains by cache salt: MatchSalted is Match
// for a prompt whose salt has digest salt. A KVView without it cannot answer for salted prompts,
// which then fall back to the tree.
type SaltedMatcher interface {
	MatchSalted(model string, salt uint64, toks []uint32, workers []string, out []int) bool
}

// saltMark opens a salted routing text; the digest's 16 hex digits and a NUL follow it.
const saltMark = "\x00cache_salt:"

// SaltMarkLen is the length of the opening SaltedText puts before a salted routing text.
const SaltMarkLen = len(saltMark) + 16 + 1

// SaltedText returns text after the mark of the salt whose digest is salt. An unsalted prompt
// that opens with the same bytes (a NUL, \u0000 in JSON, then the mark) only shares the trees'
// predictions of that salt's prompts: routing, not the engine's cache, which checks the salt.
func SaltedText(text string, salt uint64) string {
	var b [SaltMarkLen]byte
	n := copy(b[:], saltMark)
	var d [8]byte
	binary.BigEndian.PutUint64(d[:], salt)
	hex.Encode(b[n:], d[:])
	b[SaltMarkLen-1] = 0
	return string(b[:]) + text
}

// promptChars is how many characters of req's prompt a tree match of chars characters of its
// routing text covers: the salt's mark is no part of the prompt, and a match that ends inside it
// (the marks of two salts share their opening) covers none of it.
func (req *Request) promptChars(chars int) int {
	if !req.Salted {
		return chars
	}
	return max(chars-SaltMarkLen, 0)
}

// promptText is the request's routing text without its salt's mark: the prompt itself, which a
// tokenizer sees.
func (req *Request) promptText() string {
	if req.Salted && len(req.Text) >= SaltMarkLen {
		return req.Text[SaltMarkLen:]
	}
	return req.Text
}

// matchEvents is the KV view's Match for req's prompt, keyed by its salt when it has one.
func (p *Cost) matchEvents(req *Request, toks []uint32, ids []string, out []int) bool {
	if req.Adapter != "" { // loraevents.go
		return p.kv.(AdapterMatcher).MatchAdapter(req.eventsModel(), req.Adapter, req.Salt, req.Salted, toks, ids, out) // eventsAnswer checked it implements it
	}
	if req.Salted {
		return p.kv.(SaltedMatcher).MatchSalted(req.Model, req.Salt, toks, ids, out) // tokenize checked it implements it
	}
	return p.kv.Match(req.Model, toks, ids, out)
}

// affinityKey is the placement key of req: its conversation's (Request.Affinity) when it names
// one, so that every turn of the conversation has the same rendezvous owner on every replica,
// else the prompt's own (key).
func affinityKey(req *Request, key uint64) uint64 {
	if req.Affinity == "" {
		return key
	}
	return hashString(req.Affinity)
}
