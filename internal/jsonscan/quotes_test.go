package jsonscan

import (
	"fmt"
	"strings"
	"testing"
)

// readAll reads the whole document the way a caller does: objects and arrays entered, strings
// read raw and decoded in turn, everything else skipped; it returns what it read.
func readAll(s *Scanner) []string {
	var out []string
	n := 0
	var value func()
	value = func() {
		switch s.Peek() {
		case '{':
			s.Object(func(key []byte) {
				out = append(out, "k:"+string(key))
				value()
			})
		case '[':
			s.Array(value)
		case '"':
			n++
			out = append(out, "s:"+string(s.Str(n%2 == 0)))
		default:
			s.Skip()
		}
	}
	s.Document(value)
	if err := s.Err(); err != nil {
		out = append(out, "err:"+err.Error())
	}
	return out
}

// indexed returns an index of doc's quotes built piece by piece, chunk bytes at a time, holding
// at most limit offsets.
func indexed(doc []byte, chunk, limit int) *Quotes {
	q := &Quotes{}
	for n := 0; n < len(doc); {
		n = min(n+chunk, len(doc))
		q.add(doc[:n], limit)
	}
	return q
}

func TestQuotesIndexEveryQuote(t *testing.T) {
	doc := []byte(`{"a":"x\"y","b":["` + strings.Repeat("z", 100) + `"]}`)
	q := indexed(doc, 7, maxQuotes)
	var want []uint32
	for i, c := range doc {
		if c == '"' {
			want = append(want, uint32(i))
		}
	}
	if fmt.Sprint(q.pos) != fmt.Sprint(want) || q.Covered() != len(doc) {
		t.Fatalf("pos %v covered %d, want %v and %d", q.pos, q.Covered(), want, len(doc))
	}
	// At its capacity the index stops at the first quote it could not keep.
	q = indexed(doc, 3, 4)
	if len(q.pos) != 4 || q.Covered() != int(want[4]) {
		t.Fatalf("capped: pos %v covered %d, want 4 offsets and %d", q.pos, q.Covered(), want[4])
	}
	q.Reset()
	if len(q.pos) != 0 || q.Covered() != 0 {
		t.Fatal("Reset kept offsets")
	}
}

// FuzzQuotes: a Scanner reading through an index of the document's quotes, built in pieces
// of any size and capped anywhere, reads exactly what it reads without one.
func FuzzQuotes(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"a\"b\\"}],"stream":true}`), uint16(5), uint16(3))
	f.Add([]byte(`["\\\\\"", "x"]`), uint16(1), uint16(1))
	f.Add([]byte(`{"a":"unterminated`), uint16(4), uint16(100))
	f.Add([]byte(`{"a":1,"b":"`+strings.Repeat("long ", 400)+`"}`), uint16(64), uint16(2))
	f.Fuzz(func(t *testing.T, doc []byte, chunk, limit uint16) {
		want := readAll(NewShallow(doc))
		for _, shallow := range []bool{true, false} {
			s := &Scanner{b: doc, shallow: shallow}
			s.UseQuotes(indexed(doc, int(chunk)+1, int(limit)))
			got := readAll(s)
			if !shallow {
				want = readAll(New(doc))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("shallow %v, chunk %d, limit %d:\n got %q\nwant %q", shallow, chunk+1, limit, got, want)
			}
		}
	})
}
