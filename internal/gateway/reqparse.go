package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Parsed is what the gateway needs from a request body, found in one pass over it without
// decoding the whole document: the model, whether to stream, and the routing text.
type Parsed struct {
	// Model is the body's "model" ("" when absent).
	Model string
	// Stream is the body's "stream".
	Stream bool
	// Text is the routing text (DESIGN.md §2), truncated to the parser's limit at a UTF-8
	// boundary. It is the only copy made of the prompt.
	Text string
}

// errBadBody is wrapped by every parse error; the handler maps it to 400.
var errBadBody = errors.New("invalid request body")

// routeKind says which fields carry the routing text.
type routeKind uint8

const (
	kindChat routeKind = iota
	kindCompletion
	kindGenerate
	kindEmbedding
)

// parseBody validates body as a JSON object and extracts Parsed. limit caps the routing text in
// bytes. Strings are unescaped only as far as the routing text needs.
func parseBody(body []byte, kind routeKind, limit int) (Parsed, error) {
	var p Parsed
	if !json.Valid(body) {
		return p, fmt.Errorf("%w: malformed JSON", errBadBody)
	}
	s := scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		return p, fmt.Errorf("%w: the body must be a JSON object", errBadBody)
	}
	text := textBuf{limit: limit + utf8.UTFMax, want: limit}
	err := s.object(func(key []byte) error {
		switch string(key) {
		case "model":
			if s.peek() != '"' {
				return fmt.Errorf("%w: \"model\" must be a string", errBadBody)
			}
			p.Model = string(s.str(nil, -1))
			return nil
		case "stream":
			switch s.peek() {
			case 't':
				p.Stream = true
			case 'f', 'n':
			default:
				return fmt.Errorf("%w: \"stream\" must be a boolean", errBadBody)
			}
			s.skip()
			return nil
		case "messages":
			if kind == kindChat {
				return s.messages(&text)
			}
		case "prompt":
			if kind == kindCompletion {
				return s.firstText(&text, "prompt")
			}
		case "text":
			if kind == kindGenerate {
				return s.firstText(&text, "text")
			}
		case "input":
			if kind == kindEmbedding {
				return s.firstText(&text, "input")
			}
		}
		s.skip()
		return nil
	})
	if err != nil {
		return Parsed{}, err
	}
	p.Text = text.String()
	return p, nil
}

// textBuf accumulates routing text: up to limit bytes are gathered so that String can cut at a
// rune boundary at or below want.
type textBuf struct {
	b     []byte
	limit int
	want  int
}

func (t *textBuf) full() bool { return len(t.b) >= t.limit }

func (t *textBuf) String() string {
	b := t.b
	if len(b) > t.want {
		n := t.want
		for n > 0 && !utf8.RuneStart(b[n]) {
			n--
		}
		b = b[:n]
	}
	if len(b) == 0 {
		return ""
	}
	// t.b is never written again, so the string may share its bytes: the prompt prefix is
	// copied once, from the body into t.b.
	return unsafe.String(&b[0], len(b))
}

// scanner walks JSON already known to be valid.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// object calls member for each key with the scanner positioned at the value; member must consume
// the value.
func (s *scanner) object(member func(key []byte) error) error {
	s.ws()
	s.i++ // '{'
	for {
		switch s.peek() {
		case '}':
			s.i++
			return nil
		case ',':
			s.i++
			continue
		}
		key := s.str(nil, -1)
		s.ws()
		s.i++ // ':'
		s.ws()
		if err := member(key); err != nil {
			return err
		}
	}
}

// array calls elem for each element with the scanner positioned at it; elem must consume it.
func (s *scanner) array(elem func(i int) error) error {
	s.ws()
	s.i++ // '['
	for n := 0; ; {
		switch s.peek() {
		case ']':
			s.i++
			return nil
		case ',':
			s.i++
			continue
		}
		if err := elem(n); err != nil {
			return err
		}
		n++
	}
}

// skip consumes one value of any kind.
func (s *scanner) skip() {
	s.ws()
	switch s.b[s.i] {
	case '"':
		s.i++
		for s.b[s.i] != '"' {
			if s.b[s.i] == '\\' {
				s.i++
			}
			s.i++
		}
		s.i++
	case '{', '[':
		depth := 0
		for {
			switch c := s.b[s.i]; c {
			case '"':
				s.skip()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default:
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return
			}
			s.i++
		}
	}
}

// str consumes a string and appends its unescaped content to dst, stopping once dst holds max
// bytes (max < 0: no limit); the rest of the string is consumed either way.
func (s *scanner) str(dst []byte, max int) []byte {
	s.ws()
	s.i++ // opening quote
	for {
		start := s.i
		for s.b[s.i] != '"' && s.b[s.i] != '\\' {
			s.i++
		}
		dst = appendCapped(dst, s.b[start:s.i], max)
		if s.b[s.i] == '"' {
			s.i++
			return dst
		}
		var r rune
		s.i++ // backslash
		switch c := s.b[s.i]; c {
		case 'u':
			r = s.hex4()
			if utf16.IsSurrogate(r) && s.i+6 <= len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
				save := s.i
				s.i++
				if r2 := utf16.DecodeRune(r, s.hex4()); r2 != utf8.RuneError {
					r = r2
				} else {
					s.i = save
				}
			}
			if utf16.IsSurrogate(r) {
				r = utf8.RuneError
			}
		default:
			r = rune(unescape[c])
			s.i++
		}
		if max < 0 || len(dst) < max {
			dst = utf8.AppendRune(dst, r)
		}
	}
}

// hex4 reads the four hex digits after "\u" (s.i at the 'u') and moves past them.
func (s *scanner) hex4() rune {
	var r rune
	for _, c := range s.b[s.i+1 : s.i+5] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	s.i += 5
	return r
}

var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func appendCapped(dst, src []byte, max int) []byte {
	if max >= 0 && len(dst)+len(src) > max {
		src = src[:max-min(len(dst), max)]
	}
	return append(dst, src...)
}

// messages appends the text of chat messages in order: string contents, and the "text" of
// array-content parts of type text. Other parts (images, audio) are skipped.
func (s *scanner) messages(t *textBuf) error {
	if s.peek() != '[' {
		return fmt.Errorf("%w: \"messages\" must be an array", errBadBody)
	}
	return s.array(func(int) error {
		if s.peek() != '{' {
			return fmt.Errorf("%w: each message must be an object", errBadBody)
		}
		return s.object(func(key []byte) error {
			if string(key) != "content" || t.full() {
				s.skip()
				return nil
			}
			switch s.peek() {
			case '"':
				t.b = s.str(t.b, t.limit)
			case '[':
				return s.contentParts(t)
			default:
				s.skip() // null content (tool calls) carries no text
			}
			return nil
		})
	})
}

// contentParts appends the text parts of an array content.
func (s *scanner) contentParts(t *textBuf) error {
	return s.array(func(int) error {
		if s.peek() != '{' {
			s.skip()
			return nil
		}
		var text []byte
		isText := true
		err := s.object(func(key []byte) error {
			switch string(key) {
			case "type":
				if s.peek() == '"' {
					isText = string(s.str(nil, 16)) == "text"
					return nil
				}
			case "text":
				if s.peek() == '"' && !t.full() {
					text = s.str(text, t.limit-len(t.b))
					return nil
				}
			}
			s.skip()
			return nil
		})
		if isText {
			t.b = append(t.b, text...)
		}
		return err
	})
}

// firstText appends a string value, or the first element of an array of strings. An array of
// token ids (or of arrays of ids) carries no routing text.
func (s *scanner) firstText(t *textBuf, field string) error {
	switch s.peek() {
	case '"':
		t.b = s.str(t.b, t.limit)
		return nil
	case '[':
		return s.array(func(i int) error {
			if i == 0 && s.peek() == '"' {
				t.b = s.str(t.b, t.limit)
				return nil
			}
			s.skip()
			return nil
		})
	case 'n':
		s.skip()
		return nil
	}
	return fmt.Errorf("%w: %q must be a string or an array", errBadBody, field)
}
