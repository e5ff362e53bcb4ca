package bench

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func readAllEvents(r io.Reader) ([]string, error) {
	s := NewSSEReader(r)
	var out []string
	for {
		d, err := s.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
}

func TestSSEReader(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"basic", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"a", "b"}},
		{"cr only", "data: a\r\rdata: b\r\r", []string{"a", "b"}},
		{"multi-line data", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"no space", "data:x\n\n", []string{"x"}},
		{"two spaces keep one", "data:  x\n\n", []string{" x"}},
		{"comments and fields", ": ping\nevent: message\nid: 3\ndata: y\nretry: 10\n\n", []string{"y"}},
		{"blank events skipped", "\n\n\ndata: z\n\n\n", []string{"z"}},
		{"unterminated last event dropped", "data: a\n\ndata: b", []string{"a"}},
		{"empty data field", "data\n\n", []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAllEvents(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSSELineTooLong(t *testing.T) {
	_, err := readAllEvents(strings.NewReader("data: " + strings.Repeat("x", maxSSELine+1) + "\n\n"))
	if !errors.Is(err, ErrSSELineTooLong) {
		t.Fatalf("err %v, want ErrSSELineTooLong", err)
	}
}

func TestParseChunk(t *testing.T) {
	cases := []struct {
		name, in string
		want     Chunk
		cached   int
		bad      bool
	}{
		{"done", "[DONE]", Chunk{Done: true}, 0, false},
		{"chat delta", `{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, Chunk{Content: "hi"}, 0, false},
		{"role only", `{"choices":[{"delta":{"role":"assistant"}}]}`, Chunk{}, 0, false},
		{"completion text", `{"choices":[{"text":"yo"}]}`, Chunk{Content: "yo"}, 0, false},
		{"usage", `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6}}}`, Chunk{}, 6, false},
		{"error", `{"error":{"message":"boom","type":"server_error"}}`, Chunk{Err: "boom"}, 0, false},
		{"null error", `{"error":null,"choices":[{"delta":{"content":"a"}}]}`, Chunk{Content: "a"}, 0, false},
		{"garbage", `{"choices":`, Chunk{}, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseChunk([]byte(tc.in))
			if (err != nil) != tc.bad {
				t.Fatalf("err %v, bad %v", err, tc.bad)
			}
			if tc.bad {
				return
			}
			if c.Done != tc.want.Done || c.Content != tc.want.Content || c.Err != tc.want.Err {
				t.Fatalf("got %+v, want %+v", c, tc.want)
			}
			if got := c.Usage.Cached(); got != tc.cached {
				t.Fatalf("cached %d, want %d", got, tc.cached)
			}
		})
	}
}

func FuzzSSE(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
		"data: a\r\ndata: b\r\n\r\n", ": c\n\n", "data\n\n", "\r\r\r", "data: {\"usage\":{\"prompt_tokens\":1}}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewSSEReader(strings.NewReader(string(in)))
		for i := 0; ; i++ {
			d, err := s.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrSSELineTooLong) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if i > len(in) {
				t.Fatal("more events than input bytes")
			}
			// Data never contains a line terminator other than the \n joining data lines.
			if strings.ContainsRune(string(d), '\r') {
				t.Fatalf("event data %q contains \\r", d)
			}
			if _, err := ParseChunk(d); err != nil {
				continue
			}
		}
	})
}

func FuzzParseChunk(f *testing.F) {
	for _, s := range []string{"[DONE]", `{"choices":[{"delta":{"content":"x"}}]}`, `{"usage":{"prompt_tokens_details":null}}`, `{"error":"s"}`, `{"error":{}}`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseChunk(in)
		if err != nil {
			return
		}
		_ = c.Usage.Cached() // must not panic on any accepted chunk
		if c.Done && (c.Content != "" || c.Usage != nil) {
			t.Fatal("done chunk carries content")
		}
	})
}
