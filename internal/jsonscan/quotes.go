package jsonscan

import "bytes"

// Quotes indexes the quote characters of a document while it is being received, so that a
// Scanner finds where long strings end without reading them again. Searching a piece of a body
// just after it arrived costs a search through memory the piece still occupies in the cache;
// the same search once the whole body is in (a megabyte later) reads it back from memory: at
// 1 MB bodies that search was an eighth of the gateway's CPU.
//
// The index holds the offsets of the first quotes of the document, in order, and covers a
// prefix of it: every quote before Covered is listed. It stops growing at its capacity (a
// document dense with short strings gains nothing from it), and a Scanner searches past the
// covered prefix as it would without an index. The zero value is ready to use.
type Quotes struct {
	pos     []uint32
	covered int
	full    bool
}

// maxQuotes bounds the offsets a Quotes keeps (16 KiB of them).
const maxQuotes = 4096

// Reset empties q for another document, keeping its memory.
func (q *Quotes) Reset() {
	q.pos, q.covered, q.full = q.pos[:0], 0, false
}

// Covered returns the length of the prefix of the document that q indexes.
func (q *Quotes) Covered() int { return q.covered }

// Add indexes the quotes of b[q.Covered():len(b)], where b is the document received so far (the
// same document as before, and at least as long).
func (q *Quotes) Add(b []byte) { q.add(b, maxQuotes) }

func (q *Quotes) add(b []byte, limit int) {
	if q.full || len(b) > 1<<32-1 {
		q.full = true
		return
	}
	for i := q.covered; ; {
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			q.covered = len(b)
			return
		}
		if len(q.pos) == limit {
			q.covered, q.full = i+k, true
			return
		}
		q.pos = append(q.pos, uint32(i+k))
		i += k + 1
	}
}

// UseQuotes makes s find quotes through q, an index of s's document. Call it before reading.
func (s *Scanner) UseQuotes(q *Quotes) { s.quotes = q }

// quoteAt returns the offset of the first quote at or after i, or -1.
func (s *Scanner) quoteAt(i int) int {
	if q := s.quotes; q != nil && i < q.covered {
		for s.qi < len(q.pos) && int(q.pos[s.qi]) < i {
			s.qi++
		}
		if s.qi < len(q.pos) {
			return int(q.pos[s.qi])
		}
		i = q.covered // no quote in [i, covered)
	}
	if k := bytes.IndexByte(s.b[i:], '"'); k >= 0 {
		return i + k
	}
	return -1
}
