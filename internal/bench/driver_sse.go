package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxSSELine bounds one line of an event stream; a longer line is an error, not an allocation.
const maxSSELine = 4 << 20

// ErrSSELineTooLong is returned when an event-stream line exceeds 4 MiB.
var ErrSSELineTooLong = errors.New("sse: line too long")

// SSEReader reads the data of Server-Sent Events. It follows the WHATWG framing rules that
// OpenAI-compatible servers use: lines end in \n, \r\n or \r; an empty line ends an event; the
// data of an event is its "data:" lines joined with \n (one optional space after the colon is
// dropped); comment lines (starting with ':') and other fields are ignored. The zero value is not
// usable; use NewSSEReader.
type SSEReader struct {
	r       *bufio.Reader
	data    []byte
	hasData bool
	line    []byte
	pendCR  bool // the previous line ended in \r: a following \n belongs to it
}

// NewSSEReader returns a reader of the events in r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 32*1024)}
}

// Next returns the data of the next event that has any. The slice is valid until the next call.
// At the end of the stream it returns io.EOF; a final event not followed by an empty line is
// dropped, as the standard requires.
func (s *SSEReader) Next() ([]byte, error) {
	for {
		line, err := s.readLine()
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			if s.hasData {
				s.hasData = false
				return s.data, nil
			}
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		if string(field) != "data" {
			continue // comment, event, id, retry: not needed here
		}
		if !s.hasData {
			s.data = s.data[:0]
			s.hasData = true
		} else {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
	}
}

// readLine returns the next line without its terminator.
func (s *SSEReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		b, err := s.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(s.line) > 0 {
				// An unterminated last line cannot complete an event; report the end.
				return nil, io.EOF
			}
			return nil, err
		}
		if s.pendCR {
			s.pendCR = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return s.line, nil
		case '\r':
			s.pendCR = true
			return s.line, nil
		}
		if len(s.line) >= maxSSELine {
			return nil, ErrSSELineTooLong
		}
		s.line = append(s.line, b)
	}
}

// Usage is the token accounting of an OpenAI-compatible response.
type Usage struct {
	// PromptTokens and CompletionTokens are the request's token counts.
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// PromptTokensDetails carries cached_tokens: the prompt tokens served from the prefix cache.
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// Cached returns the server-reported cached prompt tokens, 0 when absent.
func (u *Usage) Cached() int {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// Chunk is what one streamed event says.
type Chunk struct {
	// Done is true for the "[DONE]" sentinel.
	Done bool
	// Content is the generated text in the event (chat delta content, or completion text).
	Content string
	// Usage is present on the usage event (stream_options.include_usage).
	Usage *Usage
	// Err is the message of an in-stream error event.
	Err string
}

// ParseChunk decodes the data of one event of a chat-completions or completions stream.
func ParseChunk(data []byte) (Chunk, error) {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return Chunk{Done: true}, nil
	}
	var raw struct {
		Choices []struct {
			Delta *struct {
				Content *string `json:"content"`
			} `json:"delta"`
			Text *string `json:"text"`
		} `json:"choices"`
		Usage *Usage           `json:"usage"`
		Error *json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Chunk{}, fmt.Errorf("sse: bad chunk: %w", err)
	}
	c := Chunk{Usage: raw.Usage}
	for _, ch := range raw.Choices {
		if ch.Delta != nil && ch.Delta.Content != nil {
			c.Content += *ch.Delta.Content
		}
		if ch.Text != nil {
			c.Content += *ch.Text
		}
	}
	if raw.Error != nil && string(*raw.Error) != "null" {
		c.Err = errorMessage(*raw.Error)
	}
	return c, nil
}

// errorMessage extracts the message of an OpenAI error object (or a bare string).
func errorMessage(raw json.RawMessage) string {
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Message != "" {
		return obj.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	return "error event"
}
