package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/proxy"
)

// Request bodies live in pooled buffers of power-of-two size classes, from minClass to maxClass
// bytes. A body is read into the smallest class and moved to a larger one as its bytes arrive,
// so no request costs a fresh (zeroed) buffer in the steady state, and a client that declares a
// huge Content-Length and sends little gets little memory.
const (
	minClassShift = 14 // 16 KiB
	maxClassShift = 24 // 16 MiB: larger bodies use buffers of their own, dropped after use
	numClasses    = maxClassShift - minClassShift + 1
	// growth bounds how much larger each buffer may be than the one it replaces: memory held for
	// a body is never more than growth times the bytes that have arrived (plus minClass).
	growth = 4
	// A body whose declared length is at most preallocMax gets a buffer of that length at
	// once, without growth copies, while the bytes so taken ahead of their arrival stay within
	// preallocBudget across every body still arriving; past the budget (clients declaring
	// bodies and sending them slowly, or never), bodies grow as their bytes arrive.
	preallocMax    = 4 << 20
	preallocBudget = 64 << 20
	// A body that reaches indexFrom bytes has its quotes indexed as its bytes arrive
	// (jsonscan.Quotes): below that the parser's own search reads memory still in the cache.
	indexFrom = 32 << 10
)

// bodyPool holds the free buffers of each size class. The zero value is ready to use.
type bodyPool struct {
	classes [numClasses]sync.Pool // of *[]byte, len == cap == the class size
	// scribble overwrites every buffer returned to the pool, so a test sees at once a buffer
	// recycled while something still reads it.
	scribble bool
	// ahead is the size of the buffers taken at a body's declared length, before its bytes
	// arrived, by bodies still being read: at most budget (zero: preallocBudget).
	ahead  atomic.Int64
	budget int64
	// quotes holds free quote indexes (*jsonscan.Quotes).
	quotes sync.Pool
	// memory bounds the buffers of every body read, held until the body's last Release
	// (bodybudget.go); nil means no bound.
	memory *bodyBudget
	// big holds the free buffers above maxClass (bigbody.go).
	big bigPools
}

// reserve takes n bytes of the budget for a buffer given ahead of its bytes, and reports
// whether it could; the caller gives them back with unreserve once the body is read.
func (p *bodyPool) reserve(n int64) bool {
	budget := p.budget
	if budget == 0 {
		budget = preallocBudget
	}
	if p.ahead.Add(n) > budget {
		p.ahead.Add(-n)
		return false
	}
	return true
}

func (p *bodyPool) unreserve(n int64) { p.ahead.Add(-n) }

// classOf returns the smallest class holding n bytes, or -1 when n is above maxClass.
func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	c := bits.Len(uint(n-1)) - minClassShift
	if c >= numClasses {
		return -1
	}
	return c
}

// get returns a buffer of at least n bytes: pooled when n fits a class.
func (p *bodyPool) get(n int) *[]byte {
	c := classOf(n)
	if c < 0 {
		return p.big.getBig(n)
	}
	if v := p.classes[c].Get(); v != nil {
		return v.(*[]byte)
	}
	b := make([]byte, 1<<(c+minClassShift))
	return &b
}

// put returns buf to its class (or its step above maxClass); any other buffer is left to the
// garbage collector.
func (p *bodyPool) put(buf *[]byte) {
	n := len(*buf)
	c := classOf(n)
	big := c < 0 && n>>bigStepShift > 1 && n&(1<<bigStepShift-1) == 0
	if !big && (c < 0 || n != 1<<(c+minClassShift)) {
		return
	}
	if p.scribble {
		for i := range *buf {
			(*buf)[i] = 0xAA
		}
	}
	if big {
		p.big.putBig(buf)
		return
	}
	p.classes[c].Put(buf)
}

// Body is a request body in a pooled buffer, shared by everything that reads it: the parser,
// each upstream attempt (which net/http may go on reading after the attempt returned), both
// halves of a disaggregated request. It counts its holders and goes back to the pool when the
// last one releases it; after that its bytes must not be read.
type Body struct {
	pool *bodyPool
	buf  *[]byte
	n    int
	refs atomic.Int32
	// charged is what the body's buffer holds of the pool's memory budget.
	charged int64
	// quotes indexes the body's quotes once it is indexFrom bytes long (nil before).
	quotes *jsonscan.Quotes
}

var _ proxy.BodyRef = (*Body)(nil)

// newBody returns an empty Body with one holder, the caller.
func (p *bodyPool) newBody(size int) *Body {
	b := &Body{pool: p, buf: p.get(size)}
	b.refs.Store(1)
	return b
}

// Bytes returns the body. Valid while the caller holds the Body.
func (b *Body) Bytes() []byte { return (*b.buf)[:b.n] }

// Retain adds a holder.
func (b *Body) Retain() { b.refs.Add(1) }

// Release drops a holder; the last one returns the buffer to the pool.
func (b *Body) Release() {
	switch n := b.refs.Add(-1); {
	case n == 0:
		b.pool.put(b.buf)
		b.buf = nil
		b.pool.memory.release(b.charged)
		b.charged = 0
		if q := b.quotes; q != nil {
			q.Reset()
			b.pool.quotes.Put(q)
			b.quotes = nil
		}
	case n < 0:
		panic("gateway: request body released more often than retained")
	}
}

// shrink moves the body out of its pooled buffer into one of its own length when that buffer is
// at least twice the body, for a request that is about to wait in the queue: a queued request
// then holds its bytes, not a pool class (16 KiB at least). Only the sole holder may call it;
// slices from an earlier Bytes are invalid after it.
func (b *Body) shrink() {
	if b.buf == nil || b.refs.Load() != 1 || len(*b.buf) < 2*b.n {
		return
	}
	nb := make([]byte, b.n)
	copy(nb, (*b.buf)[:b.n])
	b.pool.put(b.buf)
	b.buf = &nb
	if b.charged > int64(b.n) {
		b.pool.memory.release(b.charged - int64(b.n))
		b.charged = int64(b.n)
	}
}

// grow makes room for at least one more byte: it moves the body to a buffer up to growth times
// larger, and no larger than limit; a smaller declared length (want) stops it at the class that
// holds want. A declared length never makes a buffer larger than growth alone would.
//
// The larger buffer is taken from the pool's memory budget first; false (nothing changed) when
// the budget had no room for it within its wait.
func (b *Body) grow(ctx context.Context, want, limit int64) bool {
	size := min(int64(len(*b.buf))*growth, limit)
	if want > int64(b.n) && (want < size || size > 1<<maxClassShift) {
		// Past the pooled classes, a declared body that has sent the largest class's bytes
		// moves to a buffer of its declared length at once: every step beyond would leave a
		// buffer of no class behind as garbage, memory the budget no longer counts.
		size = min(want, limit)
	}
	if !b.charge(ctx, bufferSize(int(size))) {
		return false
	}
	nb := b.pool.get(int(size))
	copy(*nb, (*b.buf)[:b.n])
	b.pool.put(b.buf)
	b.buf = nb
	return true
}

// charge makes the body's charge on the memory budget n bytes (what its next buffer holds),
// taking the difference; false when the budget had no room for it.
func (b *Body) charge(ctx context.Context, n int64) bool {
	if n <= b.charged {
		return true
	}
	if !b.pool.memory.acquire(ctx, n-b.charged) {
		return false
	}
	b.charged = n
	return true
}

// bufferSize is the size of the buffer get returns for n bytes.
func bufferSize(n int) int64 {
	if c := classOf(n); c >= 0 {
		return 1 << (c + minClassShift)
	}
	return bigSize(n)
}

// errBodyBudget is readBody's error for a body refused because the gateway-wide memory budget
// for bodies had no room for it (503).
var errBodyBudget = errors.New("the gateway holds as many request bodies as its memory budget allows")

// index adds the bytes that arrived since its last call to the body's quote index, while they
// are still in the cache.
func (b *Body) index() {
	if b.quotes == nil {
		q, _ := b.pool.quotes.Get().(*jsonscan.Quotes)
		if q == nil {
			q = &jsonscan.Quotes{}
		}
		b.quotes = q
	}
	b.quotes.Add((*b.buf)[:b.n])
}

// errEmptyBody is readBody's error for a request without a body.
var errEmptyBody = errors.New("the request body is empty")

// readBody reads the whole request body into a pooled Body, which the caller must Release. It
// answers 413 as soon as more than max bytes arrive (or are declared), 400 for an empty or
// broken body, and 499 when the client left. A body starts in the smallest buffer and grows as
// its bytes arrive, except that one declared at up to preallocMax bytes gets its full buffer at
// once while the pool's budget for buffers given ahead of their bytes lasts.
func (p *bodyPool) readBody(r *http.Request, max int64) (*Body, int, error) {
	if r.ContentLength > max {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, max)
	}
	ctx := r.Context()
	first := 1 << minClassShift
	if n := r.ContentLength; n > int64(first) && n <= preallocMax {
		// Growth would copy the body's first bytes into ever larger buffers (for 100 KB, 80 KB
		// copied, and shorter reads at each step): take the declared length at once.
		if size := int64(1) << (classOf(int(n)) + minClassShift); p.reserve(size) {
			defer p.unreserve(size)
			first = int(n)
		}
	}
	size := bufferSize(first)
	if !p.memory.acquire(ctx, size) {
		return nil, http.StatusServiceUnavailable, errBodyBudget
	}
	b := p.newBody(first)
	b.charged = size
	var scratch [1]byte
	for {
		dst, probe := (*b.buf)[b.n:], false
		switch {
		case len(dst) > 0:
		case int64(b.n) == r.ContentLength:
			dst, probe = scratch[:], true // every declared byte is in: wait for EOF, do not grow
		default:
			if !b.grow(ctx, r.ContentLength, max+1) {
				b.Release()
				return nil, http.StatusServiceUnavailable, errBodyBudget
			}
			dst = (*b.buf)[b.n:]
		}
		if room := max + 1 - int64(b.n); int64(len(dst)) > room {
			dst = dst[:room]
		}
		n, err := r.Body.Read(dst)
		if n > 0 && probe {
			if !b.grow(ctx, r.ContentLength+1, max+1) {
				b.Release()
				return nil, http.StatusServiceUnavailable, errBodyBudget
			}
			(*b.buf)[b.n] = scratch[0]
		}
		b.n += n
		if b.n >= indexFrom {
			b.index()
		}
		if int64(b.n) > max {
			b.Release()
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds the limit of %d bytes", max)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Release()
			if r.Context().Err() != nil {
				return nil, 499, err
			}
			return nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
		}
	}
	if b.n == 0 {
		b.Release()
		return nil, http.StatusBadRequest, errEmptyBody
	}
	return b, 0, nil
}
