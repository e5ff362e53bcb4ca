package gateway

import (
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// The Responses API (POST /v1/responses). Its routing text is the body's "instructions" (the
// system prompt the engine puts first) followed by the text of its "input": a string, or an
// array of items whose "content" is a string or an array of parts with a "text" (input_text,
// output_text). Items without text (function call outputs, images, files) add none.
// "previous_response_id" names the turn a request follows (responses.go routes it back to the
// worker that answered that turn).

// responsesMember reads one top-level member of a Responses body, reporting false for a member it
// does not read (the caller skips it).
func responsesMember(s *jsonscan.Scanner, key []byte, p *Parsed, text, instr *textBuf, bad func(string)) bool {
	switch string(key) {
	case "input":
		switch s.Peek() {
		case '"':
			text.add(s.Str(false))
		case '[':
			responseItems(s, text)
		default:
			bad(`"input" must be a string or an array`)
		}
	case "instructions":
		switch {
		case s.Null():
		case s.Peek() == '"':
			instr.add(s.Str(false))
		default:
			bad(`"instructions" must be a string`)
		}
	case "previous_response_id":
		switch {
		case s.Null():
		case s.Peek() == '"':
			p.PreviousResponseID = string(s.Str(true))
		default:
			bad(`"previous_response_id" must be a string`)
		}
	default:
		return false
	}
	return true
}

// responseItems appends the text of an input array's items, in order.
func responseItems(s *jsonscan.Scanner, t *textBuf) {
	s.Array(func() {
		if s.Peek() != '{' {
			s.Skip()
			return
		}
		messageContent(s, t, responseTextPart)
	})
}

// responseTextPart reports whether a Responses content part of type typ carries text.
func responseTextPart(typ []byte) bool {
	switch string(typ) {
	case "input_text", "output_text", "text":
		return true
	}
	return false
}

// then returns the routing text t followed by next: the text gathered from two members of a
// body, in prompt order whatever their order in the body.
func (t *textBuf) then(next *textBuf) textBuf {
	if len(t.b) == 0 {
		out := *next
		out.total += t.total
		return out
	}
	out := *t
	out.total += next.total
	if !out.full() && len(next.b) > 0 {
		out.b = append(out.b, next.b[:min(len(next.b), out.limit-len(out.b))]...)
	}
	if out.err == nil {
		out.err = next.err
	}
	return out
}
