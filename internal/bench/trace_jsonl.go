package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"sync"
	"time"
)

// TraceEntry is one line of a JSONL trace: one request.
//
//	{"arrival": 0.25, "prompt": "...", "output_tokens": 64}
//	{"arrival": 0.31, "prompt_tokens": 900, "prefix_id": "sys-3", "prefix_tokens": 600, "output_tokens": 64, "session": "u17"}
//
// Either Prompt or PromptTokens is required. With PromptTokens the text is synthesized: the
// prefix named by PrefixID (the same text every time the id appears, PrefixTokens words long)
// followed by a unique tail up to PromptTokens words.
type TraceEntry struct {
	// Arrival is the request's arrival offset in seconds from the start of the trace; >= 0.
	Arrival float64 `json:"arrival"`
	// Prompt is the prompt text; "" when the trace gives only lengths.
	Prompt string `json:"prompt,omitempty"`
	// PromptTokens is the prompt length in tokens when Prompt is absent.
	PromptTokens int `json:"prompt_tokens,omitempty"`
	// PrefixID names a shared prefix; "" for none.
	PrefixID string `json:"prefix_id,omitempty"`
	// PrefixTokens is the shared prefix's length in tokens; zero means half of PromptTokens.
	PrefixTokens int `json:"prefix_tokens,omitempty"`
	// OutputTokens is the number of tokens to generate; zero means 64.
	OutputTokens int `json:"output_tokens,omitempty"`
	// Session is the session routing key; "" means one session per request.
	Session string `json:"session,omitempty"`
}

// maxTraceTokens bounds synthesized prompt lengths so that a corrupt trace cannot ask for
// gigabytes of text.
const maxTraceTokens = 1 << 20

// ParseTraceLine decodes and validates one trace line.
func ParseTraceLine(line []byte) (TraceEntry, error) {
	var e TraceEntry
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("bad JSON: %w", err)
	}
	if dec.More() {
		return e, errors.New("bad JSON: more than one value on the line")
	}
	switch {
	case math.IsNaN(e.Arrival) || math.IsInf(e.Arrival, 0) || e.Arrival < 0 || e.Arrival > 1e9:
		return e, fmt.Errorf("arrival %v must be a number of seconds in [0, 1e9]", e.Arrival)
	case e.Prompt == "" && e.PromptTokens <= 0:
		return e, errors.New("needs prompt or a positive prompt_tokens")
	case e.PromptTokens < 0 || e.PromptTokens > maxTraceTokens:
		return e, fmt.Errorf("prompt_tokens %d out of range [0, %d]", e.PromptTokens, maxTraceTokens)
	case e.PrefixTokens < 0 || e.PrefixTokens > maxTraceTokens:
		return e, fmt.Errorf("prefix_tokens %d out of range [0, %d]", e.PrefixTokens, maxTraceTokens)
	case e.OutputTokens < 0 || e.OutputTokens > maxTraceTokens:
		return e, fmt.Errorf("output_tokens %d out of range [0, %d]", e.OutputTokens, maxTraceTokens)
	case e.PrefixID == "" && e.PrefixTokens > 0:
		return e, errors.New("prefix_tokens needs a prefix_id")
	}
	e.OutputTokens = cmp.Or(e.OutputTokens, 64)
	return e, nil
}

// ParseTrace reads a JSONL trace. Blank lines and lines starting with '#' are skipped. Errors name
// the line. Entries must be in non-decreasing arrival order.
func ParseTrace(r io.Reader) ([]TraceEntry, error) {
	return parseLines(r, "trace", true, ParseTraceLine, func(prev, e TraceEntry) error {
		if e.Arrival < prev.Arrival {
			return fmt.Errorf("arrival %v is before the previous line's %v", e.Arrival, prev.Arrival)
		}
		return nil
	})
}

// parseLines reads a trace of one entry a line with parse; what names the trace in errors
// ("trace"), which name the line. Blank lines are skipped, and with comments lines starting with
// '#'. order checks each entry against the one before it. A trace with no entries is an error.
func parseLines[E any](r io.Reader, what string, comments bool, parse func([]byte) (E, error), order func(prev, e E) error) ([]E, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	var out []E
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || comments && line[0] == '#' {
			continue
		}
		e, err := parse(line)
		if err == nil && len(out) > 0 {
			err = order(out[len(out)-1], e)
		}
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", what, n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no requests", what)
	}
	return out, nil
}

// Trace replays a recorded trace: one session per line (grouping by session key only affects
// routing), arriving at the recorded times under an open loop.
type Trace struct {
	seed    uint64
	entries []TraceEntry

	mu     sync.Mutex
	prefix map[string]string // prefix id → its longest synthesized text so far
}

// NewTrace builds the trace workload from parsed entries; seed fixes synthesized text.
func NewTrace(entries []TraceEntry, seed uint64) *Trace {
	return &Trace{seed: seed, entries: entries, prefix: map[string]string{}}
}

// LoadTrace reads and parses the JSONL trace at path.
func LoadTrace(path string, seed uint64) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	es, err := ParseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return NewTrace(es, seed), nil
}

// Name returns "trace".
func (*Trace) Name() string { return "trace" }

// Len returns the number of requests in the trace.
func (t *Trace) Len() int { return len(t.entries) }

// Session returns line k as a one-turn session with its recorded arrival.
func (t *Trace) Session(k int) (Session, bool) {
	if k < 0 || k >= len(t.entries) {
		return Session{}, false
	}
	e := &t.entries[k]
	text := e.Prompt
	if text == "" {
		text = t.synthesize(k, e)
	}
	key := e.Session
	if key == "" {
		key = fmt.Sprintf("r%d", k)
	}
	return Session{
		ID:    k,
		Key:   key,
		Turns: []Turn{{Messages: []Message{{Role: "user", Content: text}}, OutputTokens: e.OutputTokens, PrefixID: e.PrefixID}},
		At:    time.Duration(e.Arrival * float64(time.Second)),
		Timed: true,
	}, true
}

// synthesize builds a prompt of e.PromptTokens words starting with e's shared prefix.
func (t *Trace) synthesize(k int, e *TraceEntry) string {
	n := e.PromptTokens
	var prefix string
	if e.PrefixID != "" {
		pl := e.PrefixTokens
		if pl == 0 {
			pl = n / 2
		}
		pl = min(pl, n)
		// The same id may be declared with different lengths: the text comes from one random
		// stream per id, so a shorter version is always a prefix of a longer one.
		t.mu.Lock()
		base, ok := t.prefix[e.PrefixID]
		if !ok || len(base) < pl*4 {
			h := fnv.New64a()
			h.Write([]byte(e.PrefixID))
			base = Words(rngFor(t.seed, 6, int(h.Sum64()>>1)), max(pl, 1))
			t.prefix[e.PrefixID] = base
		}
		t.mu.Unlock()
		prefix = firstWords(base, pl)
		n -= pl
	}
	return prefix + Words(rngFor(t.seed, 7, k), n)
}

// firstWords returns the first n space-terminated words of s.
func firstWords(s string, n int) string {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			if n--; n == 0 {
				return s[:i+1]
			}
		}
	}
	return s
}
