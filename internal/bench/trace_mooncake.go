package bench

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// MooncakeEntry is one line of a Mooncake-format trace (FAST'25):
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
//
// Each hash id stands for one block of BlockTokens prompt tokens (512 in the published traces);
// two requests share a prompt prefix exactly as far as their hash-id lists agree. Ids are
// global to the file.
type MooncakeEntry struct {
	// Timestamp is the arrival in milliseconds from the start of the trace.
	Timestamp float64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the number of tokens generated; zero is sent as one.
	OutputLength int `json:"output_length"`
	// HashIDs are the prompt's blocks, in order.
	HashIDs []int64 `json:"hash_ids"`
}

// maxHashID bounds hash ids: the published traces use small dense ids, and a bound keeps a
// corrupt line from being mistaken for data.
const maxHashID = 1 << 53

// ParseMooncakeLine decodes and validates one trace line for blocks of blockTokens tokens.
// Unknown fields are ignored (traces grow fields); a field of the wrong type, a negative or
// non-finite value, or more hash ids than the input length covers is an error.
func ParseMooncakeLine(line []byte, blockTokens int) (MooncakeEntry, error) {
	var e MooncakeEntry
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return e, fmt.Errorf("bad JSON: %w", err)
	}
	for _, k := range []string{"timestamp", "input_length", "hash_ids"} {
		if _, ok := raw[k]; !ok {
			return e, fmt.Errorf("missing %q", k)
		}
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return e, fmt.Errorf("bad field: %w", err)
	}
	switch {
	case math.IsNaN(e.Timestamp) || math.IsInf(e.Timestamp, 0) || e.Timestamp < 0 || e.Timestamp > 1e12:
		return e, fmt.Errorf("timestamp %v must be milliseconds in [0, 1e12]", e.Timestamp)
	case e.InputLength < 1 || e.InputLength > maxTraceTokens:
		return e, fmt.Errorf("input_length %d out of range [1, %d]", e.InputLength, maxTraceTokens)
	case e.OutputLength < 0 || e.OutputLength > maxTraceTokens:
		return e, fmt.Errorf("output_length %d out of range [0, %d]", e.OutputLength, maxTraceTokens)
	case len(e.HashIDs) > (e.InputLength+blockTokens-1)/blockTokens:
		return e, fmt.Errorf("%d hash_ids but input_length %d covers only %d blocks of %d tokens",
			len(e.HashIDs), e.InputLength, (e.InputLength+blockTokens-1)/blockTokens, blockTokens)
	}
	for _, id := range e.HashIDs {
		if id < 0 || id > maxHashID {
			return e, fmt.Errorf("hash id %d out of range [0, 2^53]", id)
		}
	}
	return e, nil
}

// ParseMooncake reads a Mooncake-format trace for blocks of blockTokens tokens. Blank lines are
// skipped; errors name the line. Timestamps must not decrease.
func ParseMooncake(r io.Reader, blockTokens int) ([]MooncakeEntry, error) {
	if blockTokens < 1 || blockTokens > 1<<16 {
		return nil, fmt.Errorf("block tokens %d must be in [1, 65536]", blockTokens)
	}
	parse := func(line []byte) (MooncakeEntry, error) { return ParseMooncakeLine(line, blockTokens) }
	return parseLines(r, "mooncake trace", false, parse, func(prev, e MooncakeEntry) error {
		if e.Timestamp < prev.Timestamp {
			return fmt.Errorf("timestamp %v is before the previous line's %v", e.Timestamp, prev.Timestamp)
		}
		return nil
	})
}

// WriteMooncake writes entries as a Mooncake-format trace, one JSON object a line.
func WriteMooncake(w io.Writer, entries []MooncakeEntry) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range entries {
		if err := enc.Encode(&entries[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// MooncakeOptions say how a Mooncake-format trace is replayed.
type MooncakeOptions struct {
	// BlockTokens is the tokens one hash id stands for. Zero means 512, the published traces'.
	BlockTokens int
	// TimeScale multiplies the trace's arrival offsets: 0.5 replays twice as fast. Zero means 1.
	TimeScale float64
	// From and To select the window [From, To) of trace time (before scaling); the window's
	// start becomes time zero. Zero To means the end of the trace.
	From, To time.Duration
	// Seed fixes the text each hash id becomes.
	Seed uint64
	// Spread replays the requests that share a timestamp evenly over the Spread after it (or up
	// to the next timestamp, if sooner), in their order, instead of all at that instant. A trace
	// whose clock is coarse (the public conversation trace's timestamps fall on 3 s steps) holds
	// bursts no real client sent at one instant; Spread undoes that granularity. Zero replays the
	// recorded instants.
	Spread time.Duration
}

func (o MooncakeOptions) withDefaults() MooncakeOptions {
	o.BlockTokens = cmp.Or(o.BlockTokens, 512)
	o.TimeScale = cmp.Or(o.TimeScale, 1)
	return o
}

// Validate reports the first invalid option.
func (o MooncakeOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.BlockTokens < 1 || o.BlockTokens > 1<<16:
		return fmt.Errorf("block tokens %d must be in [1, 65536]", o.BlockTokens)
	case !(o.TimeScale > 0) || o.TimeScale > 1e6:
		return fmt.Errorf("time scale %v must be in (0, 1e6]", o.TimeScale)
	case o.From < 0 || o.To < 0 || (o.To > 0 && o.To <= o.From):
		return fmt.Errorf("window [%v, %v) must be non-negative and non-empty", o.From, o.To)
	case o.Spread < 0 || o.Spread > time.Hour:
		return fmt.Errorf("spread %v must be in [0, 1h]", o.Spread)
	}
	return nil
}

// Mooncake replays a Mooncake-format trace: one single-turn session per line, at its recorded
// (scaled) time under an open loop. Hash id h becomes the same BlockTokens words of text wherever
// it appears (a pure function of the seed and h: one word is one engine token, 4 bytes), so shared
// blocks are shared text and different ids never share a block; a request's last block is cut to
// its input_length, and an input_length beyond its blocks is filled with text unique to the line.
// The zero value is not usable; use NewMooncake or LoadMooncake.
type Mooncake struct {
	opt     MooncakeOptions
	entries []MooncakeEntry
	lines   []int     // entries[i]'s index in the whole trace, for unique filler text
	offset  []float64 // entries[i]'s arrival past its timestamp under Spread, in milliseconds
}

// NewMooncake builds the replay of entries (in timestamp order) under opt.
func NewMooncake(entries []MooncakeEntry, opt MooncakeOptions) (*Mooncake, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	opt = opt.withDefaults()
	m := &Mooncake{opt: opt}
	from, to := ms(opt.From), ms(opt.To)
	for i, e := range entries {
		if e.Timestamp < from || (opt.To > 0 && e.Timestamp >= to) {
			continue
		}
		m.entries = append(m.entries, e)
		m.lines = append(m.lines, i)
	}
	if len(m.entries) == 0 {
		return nil, fmt.Errorf("no request of the trace falls in the window [%v, %v)", opt.From, opt.To)
	}
	if opt.Spread > 0 {
		m.offset = spreadOffsets(m.entries, ms(opt.Spread))
	}
	return m, nil
}

// spreadOffsets returns, for entries in timestamp order, each one's offset past its timestamp
// when the n entries of one timestamp are spread evenly over the spread milliseconds after it
// (or up to the next timestamp, if sooner): the k-th of them at k/n of that span.
func spreadOffsets(entries []MooncakeEntry, spread float64) []float64 {
	off := make([]float64, len(entries))
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && entries[j].Timestamp == entries[i].Timestamp {
			j++
		}
		span := spread
		if j < len(entries) {
			span = min(span, entries[j].Timestamp-entries[i].Timestamp)
		}
		for k := i; k < j; k++ {
			off[k] = span * float64(k-i) / float64(j-i)
		}
		i = j
	}
	return off
}

// LoadMooncake reads the Mooncake-format trace at path and builds its replay.
func LoadMooncake(path string, opt MooncakeOptions) (*Mooncake, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	es, err := ParseMooncake(f, opt.withDefaults().BlockTokens)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return NewMooncake(es, opt)
}

// Name returns "mooncake".
func (*Mooncake) Name() string { return "mooncake" }

// Len returns the number of requests in the window.
func (m *Mooncake) Len() int { return len(m.entries) }

// Entries returns the requests of the window (shared; do not modify).
func (m *Mooncake) Entries() []MooncakeEntry { return m.entries }

// Session returns request k of the window as a one-turn session.
func (m *Mooncake) Session(k int) (Session, bool) {
	if k < 0 || k >= len(m.entries) {
		return Session{}, false
	}
	e := &m.entries[k]
	at := e.Timestamp - ms(m.opt.From)
	if m.offset != nil {
		at += m.offset[k]
	}
	at *= m.opt.TimeScale
	t := Turn{
		Messages:     []Message{{Role: "user", Content: m.Text(k)}},
		OutputTokens: max(e.OutputLength, 1),
	}
	if len(e.HashIDs) > 0 {
		t.PrefixID = fmt.Sprintf("h%d", e.HashIDs[0])
	}
	return Session{
		ID:    k,
		Key:   fmt.Sprintf("m%d", m.lines[k]),
		Turns: []Turn{t},
		At:    time.Duration(at * float64(time.Millisecond)),
		Timed: true,
	}, true
}

// Text returns the prompt of request k: its blocks' text, cut to its input_length.
func (m *Mooncake) Text(k int) string {
	e := &m.entries[k]
	bt := m.opt.BlockTokens
	var b strings.Builder
	b.Grow(e.InputLength * 4)
	left := e.InputLength
	for _, id := range e.HashIDs {
		n := min(bt, left)
		b.WriteString(Words(rngFor(m.opt.Seed, 9, int(id)), n))
		left -= n
	}
	if left > 0 {
		b.WriteString(Words(rngFor(m.opt.Seed, 10, m.lines[k]), left))
	}
	return b.String()
}
