package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/policy"
)

// Parsed is what the gateway needs from a request body, found in one pass over it without
// decoding the whole document: the model, whether to stream, and the routing text.
type Parsed struct {
	// Model is the body's "model" ("" when absent).
	Model string
	// Stream is the body's "stream".
	Stream bool
	// Text is the routing text (the prompt text cache-aware matching sees), truncated to the parser's limit at a UTF-8
	// boundary. It is the only copy made of the prompt.
	Text string
	// Bootstrap is true when the body has a top-level key starting "bootstrap_": fields the
	// gateway sets itself on a disaggregated request, which a client must not choose.
	Bootstrap bool
	// TextBytes is the length of the whole routing text as it appears in the body (escaped),
	// so that a prediction about Text can be scaled to the whole prompt.
	TextBytes int
	// User is the body's "user" (the OpenAI end-user id), a session key of last resort.
	User string
	// PreviousResponseID is a Responses API body's "previous_response_id" ("" when absent): the
	// turn it follows, whose worker holds the conversation.
	PreviousResponseID string
	// Priority is the body's integer "priority" (vLLM's: lower first), when HasPriority. A
	// priority of another type is left to the worker to refuse.
	Priority    int64
	HasPriority bool
	// Affinity holds the body's affinity fields (prompt_cache_key, conversation, cache_salt):
	// reqaffinity.go.
	Affinity

	kind routeKind // which fields carried the routing text, to parse more of it (routingText)
}

// errBadBody is wrapped by every parse error; the handler maps it to 400.
var errBadBody = errors.New("invalid request body")

var bootstrapPrefix = []byte("bootstrap_")

// routeKind says which fields carry the routing text.
type routeKind uint8

const (
	kindChat routeKind = iota
	kindCompletion
	kindGenerate
	kindEmbedding
	kindResponses
	// kindMessages is Anthropic's Messages API (/v1/messages and its count_tokens).
	kindMessages
)

// parseBody validates body as a JSON object and extracts Parsed, in one pass over the body that
// validates it too. limit caps the routing text in bytes; only that much of it is unescaped.
//
// What the gateway promises about a malformed body: it forwards a body only if the body is one
// JSON object whose grammar (RFC 8259) holds everywhere outside the contents of strings, so that
// the gateway and the worker see the same members; the members it reads have the types the API
// gives them ("model" a string, "stream" a boolean or null, "messages" an array of objects,
// "prompt", "text" and "input" a string, an array or null); and every string it decodes (keys,
// "model", "user", and the routing text up to its cap) is valid JSON text: no raw control
// character, no malformed escape. Every other body is answered 400 invalid_request and reaches
// no worker. The contents of the strings it does not decode (a prompt past the routing-text
// cap, the members it skips) are read only for where they end, at memory speed: a raw control
// character or a malformed escape there is left to the worker's own parser, which answers it
// with its own 400. So a body encoding/json.Valid accepts is always accepted, with the same
// fields; and a body it rejects is forwarded only when its sole faults lie inside strings the
// gateway never decodes. FuzzParseBody and jsonscan's FuzzShallow hold this to encoding/json.
// quotes, when not nil, is an index of body's quotes (Body.index), which the parse reads
// instead of searching the body again; jsonscan's FuzzQuotes holds the parse to the same result.
func parseBody(body []byte, quotes *jsonscan.Quotes, kind routeKind, limit int) (Parsed, error) {
	p := Parsed{kind: kind}
	s := jsonscan.NewShallow(body)
	if quotes != nil {
		s.UseQuotes(quotes)
	}
	text := textBuf{limit: limit + utf8.UTFMax, want: limit, size: min(limit+utf8.UTFMax, len(body))}
	instr := text // a Responses body's "instructions", which precede its input in the prompt
	var shape error
	bad := func(msg string) {
		if shape == nil {
			shape = fmt.Errorf("%w: %s", errBadBody, msg)
		}
		s.Fail(msg)
	}
	s.Document(func() {
		if s.Peek() != '{' {
			bad("the body must be a JSON object")
			return
		}
		s.Object(func(key []byte) {
			switch {
			case string(key) == "model":
				if s.Peek() != '"' {
					bad(`"model" must be a string`)
					return
				}
				p.Model = string(s.Str(true))
				return
			case string(key) == "user" && s.Peek() == '"':
				p.User = string(s.Str(true))
				return
			case string(key) == "priority" && (s.Peek() == '-' || (s.Peek() >= '0' && s.Peek() <= '9')):
				p.Priority, p.HasPriority = s.Int()
				return
			case string(key) == "stream":
				if s.Null() {
					return
				}
				if c := s.Peek(); c != 't' && c != 'f' {
					bad(`"stream" must be a boolean`)
					return
				}
				p.Stream = s.Bool()
				return
			case isAffinityMember(key):
				affinityMember(s, key, &p.Affinity, bad)
				return
			case bytes.HasPrefix(key, bootstrapPrefix):
				p.Bootstrap = true
			case kind == kindChat && string(key) == "messages":
				messages(s, &text, bad)
				return
			case kind == kindMessages:
				if messagesMember(s, key, &text, &instr, bad) {
					return
				}
			case kind == kindResponses:
				if responsesMember(s, key, &p, &text, &instr, bad) {
					return
				}
			case kind == kindCompletion && string(key) == "prompt",
				kind == kindGenerate && string(key) == "text",
				kind == kindEmbedding && string(key) == "input":
				firstText(s, &text, string(key), bad)
				return
			}
			s.Skip()
		})
	})
	if shape != nil {
		return Parsed{}, shape
	}
	if text.err != nil {
		return Parsed{}, fmt.Errorf("%w: malformed JSON: %v", errBadBody, text.err)
	}
	if err := s.Err(); err != nil {
		return Parsed{}, fmt.Errorf("%w: malformed JSON: %v", errBadBody, err)
	}
	if kind == kindResponses || kind == kindMessages {
		text = instr.then(&text)
	}
	p.Text, p.TextBytes = text.String(), text.total
	if p.Salted {
		p.Text, p.TextBytes = policy.SaltedText(p.Text, p.Salt), p.TextBytes+policy.SaltMarkLen
	}
	return p, nil
}

// routingText returns the routing text pol routes p on (policy.RoutingText): p as parsed from
// body, with RoutingPrefixBytes of routing text, unless pol's tree holds all of that for two or
// more workers and the prompt goes on (policy.SharedThrough); only then is body parsed again for
// up to 4 × RoutingPrefixBytes, so that a prompt with no such opening costs no more decoding than
// before (a 40 KB chat body: 5–8 µs parsed to 8 KiB, 27–36 µs to 32 KiB).
func (s *Server) routingText(pol policy.Policy, body []byte, p *Parsed) string {
	if s.cfg.FixedRoutingText || p.TextBytes <= len(p.Text) || !policy.SharedThrough(pol, p.Text) {
		return p.Text
	}
	long, err := parseBody(body, nil, p.kind, policy.MaxRoutingText(s.cfg.RoutingPrefixBytes))
	if err != nil {
		return p.Text // not reached: body parsed once already
	}
	return policy.RoutingText(pol, long.Text, long.Salted, s.cfg.RoutingPrefixBytes)
}

// textBuf accumulates routing text: up to limit bytes are gathered so that String can cut at a
// rune boundary at or below want.
type textBuf struct {
	b     []byte
	limit int
	want  int
	total int // raw bytes offered, kept or not
	// size is the capacity the text gets with its first byte, so that it never grows: the text
	// is no longer than the body, nor than limit.
	size int
	// err is the first fault met in the text decoded.
	err error
}

func (t *textBuf) full() bool { return len(t.b) >= t.limit }

// add appends the decoded contents of a raw JSON string, up to the limit.
func (t *textBuf) add(raw []byte) {
	t.total += len(raw)
	if t.b == nil && len(raw) > 0 {
		t.b = make([]byte, 0, t.size)
	}
	if !t.full() && t.err == nil {
		t.b, t.err = jsonscan.DecodePrefix(t.b, raw, t.limit)
	}
}

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

// messages appends the text of chat messages in order: string contents, and the "text" of
// array-content parts of type text. Other parts (images, audio) are skipped.
func messages(s *jsonscan.Scanner, t *textBuf, bad func(string)) {
	if s.Peek() != '[' {
		bad(`"messages" must be an array`)
		return
	}
	s.Array(func() {
		if s.Peek() != '{' {
			bad("each message must be an object")
			return
		}
		messageContent(s, t, chatTextPart)
	})
}

// messageContent appends the text of one message object's "content": a string as it is, an
// array's text parts (those textPart accepts); anything else (null content of a tool call)
// carries no text.
func messageContent(s *jsonscan.Scanner, t *textBuf, textPart func(typ []byte) bool) {
	s.Object(func(key []byte) {
		if string(key) != "content" {
			s.Skip()
			return
		}
		switch s.Peek() {
		case '"':
			t.add(s.Str(false))
		case '[':
			contentParts(s, t, textPart)
		default:
			s.Skip()
		}
	})
}

// contentParts appends the text parts of an array content: the "text" of each part whose "type"
// (when it has one that is a string) textPart accepts.
func contentParts(s *jsonscan.Scanner, t *textBuf, textPart func(typ []byte) bool) {
	s.Array(func() {
		if s.Peek() != '{' {
			s.Skip()
			return
		}
		var text []byte
		isText := true
		s.Object(func(key []byte) {
			switch {
			case string(key) == "type" && s.Peek() == '"':
				isText = textPart(s.Str(true))
			case string(key) == "text" && s.Peek() == '"':
				text = s.Str(false)
			default:
				s.Skip()
			}
		})
		if isText && text != nil {
			t.add(text)
		}
	})
}

// chatTextPart reports whether a chat content part of type typ is text.
func chatTextPart(typ []byte) bool { return string(typ) == "text" }

// firstText appends a string value, or the first element of an array of strings. An array of
// token ids (or of arrays of ids) carries no routing text.
func firstText(s *jsonscan.Scanner, t *textBuf, field string, bad func(string)) {
	switch s.Peek() {
	case '"':
		t.add(s.Str(false))
	case '[':
		first := true
		s.Array(func() {
			if first && s.Peek() == '"' {
				t.add(s.Str(false))
			} else {
				s.Skip()
			}
			first = false
		})
	case 'n':
		s.Skip()
	default:
		bad(fmt.Sprintf("%q must be a string or an array", field))
	}
}
