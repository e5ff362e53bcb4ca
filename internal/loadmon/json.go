package loadmon

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds nesting, as encoding/json does, so a hostile body cannot exhaust the stack.
const maxJSONDepth = 10000

// JSONError is a /v1/loads body that is not valid JSON of the expected shape.
type JSONError struct {
	// Offset is the byte offset where reading stopped.
	Offset int
	// Msg says what was expected there.
	Msg string
}

// Error implements error.
func (e *JSONError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.Msg)
}

// jsonScanner reads one JSON document in place, validating it fully but building nothing: the
// caller walks the structure it cares about (object, array, number) and skips the rest. After
// the first error every method is a no-op, so callers check err once at the end.
type jsonScanner struct {
	b      []byte
	i      int
	err    error
	keyBuf [64]byte // decoded escaped keys; valid until the next key
}

func (s *jsonScanner) fail(msg string) {
	if s.err == nil {
		s.err = &JSONError{Offset: s.i, Msg: msg}
	}
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads the whole document: fn reads the top-level value, then only whitespace may follow.
func (s *jsonScanner) value(fn func()) {
	s.ws()
	fn()
	if s.err == nil {
		s.ws()
		if s.i != len(s.b) {
			s.fail("data after the document")
		}
	}
}

// peekNull consumes a null and reports whether there was one.
func (s *jsonScanner) peekNull() bool {
	s.ws()
	if s.err == nil && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// object reads an object, calling fn with each key; fn must read the member's value.
func (s *jsonScanner) object(fn func(key []byte)) {
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
		key := s.str(true)
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

// array reads an array, calling fn to read each element.
func (s *jsonScanner) array(fn func()) {
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

func (s *jsonScanner) expect(c byte, msg string) bool {
	if s.err != nil {
		return false
	}
	if s.i >= len(s.b) || s.b[s.i] != c {
		s.fail(msg)
		return false
	}
	s.i++
	return true
}

// skip reads and discards any value nested depth levels deep.
func (s *jsonScanner) skip(depth int) {
	s.ws()
	switch {
	case s.err != nil:
		return
	case depth >= maxJSONDepth:
		s.fail("nested too deeply")
		return
	case s.i >= len(s.b):
		s.fail("unexpected end")
		return
	}
	switch s.b[s.i] {
	case '{':
		s.object(func([]byte) { s.skip(depth + 1) })
	case '[':
		s.array(func() { s.skip(depth + 1) })
	case '"':
		s.str(false)
	case 't':
		s.literal("true")
	case 'f':
		s.literal("false")
	case 'n':
		s.literal("null")
	default:
		s.number(false)
	}
}

func (s *jsonScanner) literal(word string) {
	if len(s.b)-s.i >= len(word) && string(s.b[s.i:s.i+len(word)]) == word {
		s.i += len(word)
		return
	}
	s.fail("invalid literal")
}

// str reads a string and returns its raw contents; with decode, escapes are decoded (into
// keyBuf: a decoded string longer than keyBuf is returned raw, which matches no key we want).
func (s *jsonScanner) str(decode bool) []byte {
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
				s.fail("unterminated string")
				return nil
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if _, ok := hex4(s.b[s.i+2:]); !ok {
					s.fail("invalid \\u escape")
					return nil
				}
				s.i += 6
			default:
				s.fail("invalid escape")
				return nil
			}
		case c < 0x20:
			s.fail("control character in string")
			return nil
		default:
			s.i++
		}
	}
	s.fail("unterminated string")
	return nil
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
func (s *jsonScanner) unescape(raw []byte) []byte {
	out := s.keyBuf[:0]
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
		} else if raw[i+1] != 'u' {
			out = append(out, unescapeByte(raw[i+1]))
			i += 2
		} else {
			r, _ := hex4(raw[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2, ok = hex4(raw[i+2:])
				}
				if d := utf16.DecodeRune(r, r2); ok && d != utf8.RuneError {
					r = d
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		}
		if len(out) > len(s.keyBuf) {
			return raw
		}
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

// number reads a number (JSON grammar) and, with parse, its value.
func (s *jsonScanner) number(parse bool) (float64, bool) {
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
		s.fail("want a number")
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			s.i = i + 1
			s.fail("want a digit")
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
			s.fail("want a digit")
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
		s.fail("number out of range")
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

// keyIs reports whether key equals name under Unicode case folding, as encoding/json matches
// field names; name is ASCII.
func keyIs(key []byte, name string) bool {
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
