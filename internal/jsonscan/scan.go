// Package jsonscan reads a JSON document in place: it validates the whole document as
// encoding/json.Valid does, builds nothing, and lets the caller walk only the members it cares
// about and skip the rest. Both the gateway's request parser (model, stream, routing text) and
// the load monitor's /v1/loads parser use it, so a body is validated and read in one pass with no
// allocation beyond what the caller copies out.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds nesting, as encoding/json does, so a hostile body cannot exhaust the stack.
const MaxDepth = 10000

// Error is a document that is not valid JSON, or not of the shape the caller expects.
type Error struct {
	// Offset is the byte offset where reading stopped.
	Offset int
	// Msg says what was expected there.
	Msg string
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.Msg)
}

// Scanner reads one JSON document in place, validating it fully but building nothing: the
// caller walks the structure it cares about (Object, Array, Number, Str) and skips the rest.
// After the first error every method is a no-op, so callers check Err once at the end. The zero
// value is not useful; create one with New.
type Scanner struct {
	b      []byte
	i      int
	err    error
	keyBuf [64]byte // decoded escaped keys; valid until the next key
	// shallow: the contents of strings read raw (Str(false), and strings inside skipped values)
	// are searched for their end only.
	shallow bool
	// quotes, when set, lists where the document's quotes are (UseQuotes); qi is the first of
	// them not before the position last asked about.
	quotes *Quotes
	qi     int
}

// New returns a Scanner over b, positioned at its start, that validates the whole document as
// encoding/json.Valid does.
func New(b []byte) *Scanner { return &Scanner{b: b} }

// NewShallow returns a Scanner over b that validates the document's grammar everywhere except
// inside the contents of strings the caller does not decode: those (the raw strings Str(false)
// returns, and every string inside a skipped value) are read only for where they end, the
// first quote not escaped by a backslash, at the speed of a vectorised byte search. Keys and
// the strings read with Str(true) are validated in full; a caller decoding a raw string
// validates what it decodes with DecodePrefix. On a document that encoding/json.Valid accepts,
// a shallow Scanner reads exactly what New's does; it accepts, beyond those, documents whose
// only faults are a raw control character or a malformed escape inside an undecoded string.
func NewShallow(b []byte) *Scanner { return &Scanner{b: b, shallow: true} }

// Err returns the first error met, or nil.
func (s *Scanner) Err() error { return s.err }

// Fail records an error at the current offset, unless one was recorded already. Callers use it
// to reject a valid value of the wrong shape.
func (s *Scanner) Fail(msg string) {
	if s.err == nil {
		s.err = &Error{Offset: s.i, Msg: msg}
	}
}

func (s *Scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// Document reads the whole document: fn reads the top-level value, then only whitespace may follow.
func (s *Scanner) Document(fn func()) {
	s.ws()
	fn()
	if s.err == nil {
		s.ws()
		if s.i != len(s.b) {
			s.Fail("data after the document")
		}
	}
}

// Null consumes a null and reports whether there was one.
func (s *Scanner) Null() bool {
	s.ws()
	if s.err == nil && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// Object reads an object, calling fn with each key; fn must read the member's value.
func (s *Scanner) Object(fn func(key []byte)) {
	s.ws()
	if !s.expect('{', "want an object") {
		return
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return
	}
	for s.err == nil {
		s.ws()
		key := s.Str(true)
		s.ws()
		if !s.expect(':', "want :") {
			return
		}
		fn(key)
		if s.err != nil {
			return
		}
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == '}' {
			s.i++
			return
		}
		s.expect(',', "want , or }")
	}
}

// Array reads an array, calling fn to read each element.
func (s *Scanner) Array(fn func()) {
	s.ws()
	if !s.expect('[', "want an array") {
		return
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return
	}
	for s.err == nil {
		s.ws()
		fn()
		if s.err != nil {
			return
		}
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return
		}
		s.expect(',', "want , or ]")
	}
}

func (s *Scanner) expect(c byte, msg string) bool {
	if s.err != nil {
		return false
	}
	if s.i >= len(s.b) || s.b[s.i] != c {
		s.Fail(msg)
		return false
	}
	s.i++
	return true
}

// Peek returns the first byte of the next value (after white space), or 0 at the end or after
// an error. It consumes nothing.
func (s *Scanner) Peek() byte {
	s.ws()
	if s.err != nil || s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// Skip reads and discards one value of any kind.
func (s *Scanner) Skip() { s.skipDepth(0) }

// Bool reads true or false; anything else fails.
func (s *Scanner) Bool() bool {
	switch s.Peek() {
	case 't':
		s.literal("true")
		return true
	case 'f':
		s.literal("false")
	default:
		s.Fail("want a boolean")
	}
	return false
}

// skipDepth reads and discards any value nested depth levels deep.
func (s *Scanner) skipDepth(depth int) {
	s.ws()
	switch {
	case s.err != nil:
		return
	case depth >= MaxDepth:
		s.Fail("nested too deeply")
		return
	case s.i >= len(s.b):
		s.Fail("unexpected end")
		return
	}
	switch s.b[s.i] {
	case '{':
		s.Object(func([]byte) { s.skipDepth(depth + 1) })
	case '[':
		s.Array(func() { s.skipDepth(depth + 1) })
	case '"':
		s.Str(false)
	case 't':
		s.literal("true")
	case 'f':
		s.literal("false")
	case 'n':
		s.literal("null")
	default:
		s.Number(false)
	}
}

func (s *Scanner) literal(word string) {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return
	}
	s.Fail("invalid literal")
}

// Str reads a string and returns its raw contents (escapes as written), a slice of the
// document; with decode, escapes are decoded (into a small buffer: a decoded string longer than
// 64 bytes is returned raw, which matches no key a caller looks for). Use AppendUnescaped to
// decode a long value.
//
// The contents are validated as encoding/json does (every escape well-formed, no raw control
// character) without a loop over each byte: the closing quote is found with bytes.IndexByte
// (vectorised in the standard library), and the run before it is searched for a backslash or a
// control character sixteen bytes a step.
func (s *Scanner) Str(decode bool) []byte {
	if !s.expect('"', "want a string") {
		return nil
	}
	if s.shallow && !decode {
		return s.strEnd()
	}
	b, start := s.b, s.i
	i, escaped := start, false
	quote := -1 // absolute index of the next '"' at or after i, once found
	for {
		if quote < i {
			if quote = s.quoteAt(i); quote < 0 {
				s.i = len(b)
				s.Fail("unterminated string")
				return nil
			}
		}
		end := quote
		if k := specialAt(b[i:quote]); k >= 0 {
			end = i + k
			if b[end] != '\\' {
				s.i = end
				s.Fail("control character in string")
				return nil
			}
		}
		if end == quote {
			s.i = quote + 1
			raw := b[start:quote]
			if escaped && decode {
				return s.unescape(raw)
			}
			return raw
		}
		escaped = true
		n := escapeLen(b[end:])
		if n == 0 {
			s.i = end
			s.Fail("invalid escape")
			return nil
		}
		i = end + n
	}
}

// strEnd reads the rest of a string whose opening quote was consumed, finding its end without
// validating its contents: the first quote preceded by an even number of backslashes.
func (s *Scanner) strEnd() []byte {
	b, start := s.b, s.i
	for i := start; ; {
		q := s.quoteAt(i)
		if q < 0 {
			s.i = len(b)
			s.Fail("unterminated string")
			return nil
		}
		k := q
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 0 {
			s.i = q + 1
			return b[start:q]
		}
		i = q + 1
	}
}

// escapeLen returns the length of the well-formed escape at the start of b (which starts with a
// backslash), or 0 if it is not one.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if _, ok := hex4(b[2:]); ok {
			return 6
		}
	}
	return 0
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// specialAt returns the index of the first byte of b that a run of plain string contents cannot
// hold (a backslash, or a control character below 0x20), or -1. It tests sixteen bytes a step,
// as two words x: for a word,
//
//	(x - 0x20·ones) &^ x & highs   has a bit set in the first byte below 0x20, and
//	(y - ones) &^ y & highs        with y = x ^ '\\'·ones, in the first backslash.
//
// (A byte at or above 0x80 has its top bit set, which &^ x clears; a borrow can mark only bytes
// after a true match, so the lowest set bit is exact.)
func specialAt(b []byte) int {
	i := 0
	for ; i+16 <= len(b); i += 16 {
		x, z := binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])
		y, w := x^'\\'*ones, z^'\\'*ones
		if ((x-0x20*ones)&^x|(y-ones)&^y|(z-0x20*ones)&^z|(w-ones)&^w)&highs != 0 {
			break
		}
	}
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		y := x ^ '\\'*ones
		if m := ((x-0x20*ones)&^x | (y-ones)&^y) & highs; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c == '\\' {
			return i
		}
	}
	return -1
}

// AppendUnescaped appends the decoded contents of raw, a string's raw contents as Str returns
// them (already validated), to dst, stopping once dst holds max bytes or more (max < 0: no
// limit). It reads no further into raw than the bytes it appends need: a 100 KB string cut to
// an 8 KB routing text costs 8 KB of work. An unpaired surrogate becomes U+FFFD, as
// encoding/json decodes it; bytes that are not valid UTF-8 are kept as they are (encoding/json
// would replace them), which routing tolerates.
func AppendUnescaped(dst, raw []byte, max int) []byte {
	for i := 0; i < len(raw) && (max < 0 || len(dst) < max); {
		run := raw[i:]
		if max >= 0 && len(run) > max-len(dst) {
			run = run[:max-len(dst)]
		}
		if k := bytes.IndexByte(run, '\\'); k >= 0 {
			run = run[:k]
		}
		dst = append(dst, run...)
		if i += len(run); i >= len(raw) || raw[i] != '\\' || (max >= 0 && len(dst) >= max) {
			continue
		}
		var r rune
		r, i = unescapeAt(raw, i)
		if r < utf8.RuneSelf {
			dst = append(dst, byte(r))
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst
}

// DecodePrefix is AppendUnescaped for a raw string that a shallow Scanner did not validate: it
// validates what it decodes (escapes well-formed, no raw control character) and fails on the
// first fault, reading no further into raw than AppendUnescaped would.
func DecodePrefix(dst, raw []byte, max int) ([]byte, error) {
	for i := 0; i < len(raw) && (max < 0 || len(dst) < max); {
		run := raw[i:]
		if max >= 0 && len(run) > max-len(dst) {
			run = run[:max-len(dst)]
		}
		if k := specialAt(run); k >= 0 {
			run = run[:k]
		}
		dst = append(dst, run...)
		if i += len(run); i >= len(raw) || (max >= 0 && len(dst) >= max) {
			continue
		}
		if raw[i] != '\\' {
			return dst, &Error{Offset: i, Msg: "control character in string"}
		}
		if escapeLen(raw[i:]) == 0 {
			return dst, &Error{Offset: i, Msg: "invalid escape"}
		}
		var r rune
		r, i = unescapeAt(raw, i) // a surrogate pair's second half is decoded only if well-formed
		if r < utf8.RuneSelf {
			dst = append(dst, byte(r))
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst, nil
}

// unescapeAt decodes the escape at raw[i] and returns the rune and the index after it.
func unescapeAt(raw []byte, i int) (rune, int) {
	if raw[i+1] != 'u' {
		return rune(unescapeByte(raw[i+1])), i + 2
	}
	r, _ := hex4(raw[i+2:])
	i += 6
	if utf16.IsSurrogate(r) {
		r2, ok := rune(0), false
		if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
			r2, ok = hex4(raw[i+2:])
		}
		if d := utf16.DecodeRune(r, r2); ok && d != utf8.RuneError {
			return d, i + 6
		}
		return utf8.RuneError, i
	}
	return r, i
}

// hex4 decodes the 4 hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// unescape decodes the escapes of a validated raw string as encoding/json does (an unpaired
// surrogate becomes U+FFFD).
func (s *Scanner) unescape(raw []byte) []byte {
	out := AppendUnescaped(s.keyBuf[:0], raw, len(s.keyBuf)+1)
	if len(out) > len(s.keyBuf) {
		return raw
	}
	return out
}

// unescapeByte returns the byte a validated one-letter escape stands for.
func unescapeByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\', '/'
}

// Number reads a number (JSON grammar) and, with parse, its value.
func (s *Scanner) Number(parse bool) (float64, bool) {
	if s.err != nil {
		return 0, false
	}
	b, start := s.b, s.i
	i := start
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		s.Fail("want a number")
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			s.i = i + 1
			s.Fail("want a digit")
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if j := digits(b, i); j > i {
			i = j
		} else {
			s.i = i
			s.Fail("want a digit")
			return 0, false
		}
	}
	s.i = i
	if !parse {
		return 0, true
	}
	v, err := strconv.ParseFloat(string(b[start:i]), 64)
	if err != nil {
		s.i = start
		s.Fail("number out of range")
		return 0, false
	}
	return v, true
}

// Int reads an integer literal (no fraction, no exponent) that fits an int64, as encoding/json
// decodes a number into an int; anything else fails.
func (s *Scanner) Int() (int64, bool) {
	if s.Peek() == 0 {
		s.Fail("want an integer")
		return 0, false
	}
	start := s.i
	if _, ok := s.Number(false); !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil {
		s.i = start
		s.Fail("want an integer")
		return 0, false
	}
	return v, true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// KeyIs reports whether key equals name under Unicode case folding, as encoding/json matches
// field names; name is ASCII.
func KeyIs(key []byte, name string) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return strings.EqualFold(string(key), name) // rare: K (Kelvin) and ſ fold to ASCII
		}
	}
	if len(key) != len(name) {
		return false
	}
	for i, c := range key {
		if lower(c) != lower(name[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
