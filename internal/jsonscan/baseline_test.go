package jsonscan

// This file keeps the scanner as it was before the vectorised string scan (commit fcbccdd), as
// the baseline that BenchmarkRouteText measures the current one against, side by side in one run.

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"
)

// Scanner reads one JSON document in place, validating it fully but building nothing: the
// caller walks the structure it cares about (Object, Array, Number, Str) and skips the rest.
// After the first error every method is a no-op, so callers check Err once at the end. The zero
// value is not useful; create one with New.
type oldScanner struct {
	b      []byte
	i      int
	err    error
	keyBuf [64]byte // decoded escaped keys; valid until the next key
}

// oldNew returns a Scanner over b, positioned at its start.
func oldNew(b []byte) *oldScanner { return &oldScanner{b: b} }

// Err returns the first error met, or nil.
func (s *oldScanner) Err() error { return s.err }

// Fail records an error at the current offset, unless one was recorded already. Callers use it
// to reject a valid value of the wrong shape.
func (s *oldScanner) Fail(msg string) {
	if s.err == nil {
		s.err = &Error{Offset: s.i, Msg: msg}
	}
}

func (s *oldScanner) ws() {
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
func (s *oldScanner) Document(fn func()) {
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
func (s *oldScanner) Null() bool {
	s.ws()
	if s.err == nil && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// Object reads an object, calling fn with each key; fn must read the member's value.
func (s *oldScanner) Object(fn func(key []byte)) {
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
func (s *oldScanner) Array(fn func()) {
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

func (s *oldScanner) expect(c byte, msg string) bool {
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
func (s *oldScanner) Peek() byte {
	s.ws()
	if s.err != nil || s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// Skip reads and discards one value of any kind.
func (s *oldScanner) Skip() { s.skipDepth(0) }

// Bool reads true or false; anything else fails.
func (s *oldScanner) Bool() bool {
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
func (s *oldScanner) skipDepth(depth int) {
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

func (s *oldScanner) literal(word string) {
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
func (s *oldScanner) Str(decode bool) []byte {
	if !s.expect('"', "want a string") {
		return nil
	}
	start, escaped := s.i, false
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			if escaped && decode {
				return s.unescape(raw)
			}
			return raw
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				s.Fail("unterminated string")
				return nil
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if _, ok := hex4(s.b[s.i+2:]); !ok {
					s.Fail("invalid \\u escape")
					return nil
				}
				s.i += 6
			default:
				s.Fail("invalid escape")
				return nil
			}
		case c < 0x20:
			s.Fail("control character in string")
			return nil
		default:
			s.i++
			for s.i < len(s.b) && !oldSpecial[s.b[s.i]] {
				s.i++
			}
		}
	}
	s.Fail("unterminated string")
	return nil
}

// oldSpecial marks the bytes that end a run of plain string contents.
var oldSpecial = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// AppendUnescaped appends the decoded contents of raw, a string's raw contents as Str returns
// them (already validated), to dst, stopping once dst holds max bytes or more (max < 0: no
// limit). An unpaired surrogate becomes U+FFFD, as encoding/json decodes it; bytes that are not
// valid UTF-8 are kept as they are (encoding/json would replace them), which routing tolerates.
func oldAppendUnescaped(dst, raw []byte, max int) []byte {
	for i := 0; i < len(raw) && (max < 0 || len(dst) < max); {
		j := i
		for j < len(raw) && raw[j] != '\\' {
			j++
		}
		if max >= 0 && j-i > max-len(dst) {
			j = i + max - len(dst)
		}
		dst = append(dst, raw[i:j]...)
		if i = j; i >= len(raw) || raw[i] != '\\' || (max >= 0 && len(dst) >= max) {
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

// unescape decodes the escapes of a validated raw string as encoding/json does (an unpaired
// surrogate becomes U+FFFD).
func (s *oldScanner) unescape(raw []byte) []byte {
	out := oldAppendUnescaped(s.keyBuf[:0], raw, len(s.keyBuf)+1)
	if len(out) > len(s.keyBuf) {
		return raw
	}
	return out
}

// Number reads a number (JSON grammar) and, with parse, its value.
func (s *oldScanner) Number(parse bool) (float64, bool) {
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

// scanner is the API both scanners share, so one walk drives either.
type scanner interface {
	Document(func())
	Object(func([]byte))
	Array(func())
	Peek() byte
	Str(bool) []byte
	Skip()
	Bool() bool
	Err() error
}

// routeChat walks a chat request as the gateway's parser does: the model, stream, and the
// message contents appended with unescape up to limit bytes. It returns the routing text.
func routeChat(s scanner, unescape func(dst, raw []byte, max int) []byte, dst []byte, limit int) ([]byte, error) {
	s.Document(func() {
		s.Object(func(key []byte) {
			switch string(key) {
			case "model":
				_ = s.Str(true)
			case "stream":
				s.Bool()
			case "messages":
				s.Array(func() {
					s.Object(func(key []byte) {
						if string(key) == "content" && s.Peek() == '"' {
							if raw := s.Str(false); len(dst) < limit {
								dst = unescape(dst, raw, limit)
							}
							return
						}
						s.Skip()
					})
				})
			default:
				s.Skip()
			}
		})
	})
	return dst, s.Err()
}

// decodePrefix is DecodePrefix with its error dropped (the benchmark's bodies are valid).
func decodePrefix(dst, raw []byte, max int) []byte {
	dst, _ = DecodePrefix(dst, raw, max)
	return dst
}

// chatBody returns a chat request whose user message is about size bytes of prose; with
// newlines, a "\n" escape ends each line of 80 bytes or so, as in a pasted document or code.
func chatBody(size int, newlines bool) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","stream":false,"max_tokens":8,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"`)
	line := "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
	if newlines {
		line += `\n`
	}
	for b.Len() < size {
		b.WriteString(line)
	}
	b.WriteString(`"}]}`)
	return b.Bytes()
}

// BenchmarkRouteText measures parsing a chat body as the gateway does (a shallow scan, the
// routing text decoded and validated up to its 8 KB cap) against the baseline (the scanner as it
// was: every string validated byte by byte), in alternating rounds of the same
// run so that a shared machine's noise falls on both alike; it reports each one's time per body
// and the speed-up (old/new).
//
//	go test -run XXX -bench RouteText -count 4 ./internal/jsonscan/
func BenchmarkRouteText(b *testing.B) {
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		for _, newlines := range []bool{false, true} {
			body := chatBody(size, newlines)
			name := fmt.Sprintf("%dKB/prose", size>>10)
			if newlines {
				name = fmt.Sprintf("%dKB/lines", size>>10)
			}
			b.Run(name, func(b *testing.B) { benchRouteText(b, body) })
		}
	}
}

func benchRouteText(b *testing.B, body []byte) {
	const limit = 8 << 10
	want, err := routeChat(NewShallow(body), decodePrefix, nil, limit)
	if err != nil {
		b.Fatal(err)
	}
	if got, _ := routeChat(oldNew(body), oldAppendUnescaped, nil, limit); !bytes.Equal(got, want) {
		b.Fatal("the scanners disagree on the routing text")
	}
	dst := make([]byte, 0, limit+8)
	round := max(1, (1<<20)/len(body)) // about 1 MB of body a round
	var tNew, tOld time.Duration
	var n int
	for b.Loop() {
		t0 := time.Now()
		for range round {
			_, err = routeChat(NewShallow(body), decodePrefix, dst[:0], limit)
		}
		t1 := time.Now()
		for range round {
			_, err = routeChat(oldNew(body), oldAppendUnescaped, dst[:0], limit)
		}
		tNew, tOld, n = tNew+t1.Sub(t0), tOld+time.Since(t1), n+round
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tNew.Nanoseconds())/float64(n), "new-ns/body")
	b.ReportMetric(float64(tOld.Nanoseconds())/float64(n), "old-ns/body")
	b.ReportMetric(float64(tOld)/float64(tNew), "speedup")
}
