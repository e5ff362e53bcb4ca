package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestClassOf(t *testing.T) {
	for _, tc := range []struct{ n, class int }{
		{0, 0}, {1, 0}, {16 << 10, 0}, {16<<10 + 1, 1}, {32 << 10, 1}, {100_000, 3}, {1_000_000, 6},
		{16 << 20, numClasses - 1}, {16<<20 + 1, -1},
	} {
		if got := classOf(tc.n); got != tc.class {
			t.Errorf("classOf(%d) = %d, want %d", tc.n, got, tc.class)
		}
	}
}

// TestReadBody reads bodies of many sizes, declared and chunked, delivered in pieces, and checks
// the bytes, the limit, and that no buffer is larger than the growth rule allows.
func TestReadBody(t *testing.T) {
	var pool bodyPool
	for _, size := range []int{1, 100, 16 << 10, 16<<10 + 1, 100_000, 1 << 20, 1<<20 + 7} {
		for _, declared := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/declared=%v", size, declared), func(t *testing.T) {
				want := bytes.Repeat([]byte(`0123456789abcdefghijklmnopqrstuvwxyz"`), size/37+1)[:size]
				r := httptest.NewRequest(http.MethodPost, "/", iotest.HalfReader(bytes.NewReader(want)))
				r.ContentLength = -1
				if declared {
					r.ContentLength = int64(size)
				}
				b, status, err := pool.readBody(r, 2<<20)
				if err != nil {
					t.Fatalf("status %d: %v", status, err)
				}
				defer b.Release()
				if !bytes.Equal(b.Bytes(), want) {
					t.Fatal("bytes differ")
				}
				if c := len(*b.buf); c > max(growth*size, 1<<minClassShift) {
					t.Errorf("buffer of %d bytes for a body of %d", c, size)
				}
				if declared && len(*b.buf) != 1<<(classOf(size)+minClassShift) {
					t.Errorf("declared body of %d in a buffer of %d, want its own class", size, len(*b.buf))
				}
				// A long body's quotes were indexed as it arrived: all of them, or the
				// index's capacity (every 37th byte is a quote).
				switch {
				case size < indexFrom && b.quotes != nil:
					t.Errorf("a body of %d bytes was indexed", size)
				case size >= indexFrom && (b.quotes == nil || (b.quotes.Covered() != size && b.quotes.Covered() != 4096*37+36)):
					t.Errorf("a body of %d bytes has an index covering %v", size, b.quotes)
				}
			})
		}
	}
}

// TestReadBodyDeclaredHuge: a client that declares 256 MiB and sends 20 KB gets a buffer sized
// by what it sent, not by what it declared.
func TestReadBodyDeclaredHuge(t *testing.T) {
	var pool bodyPool
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, 20<<10)))
	r.ContentLength = 256 << 20
	b, _, err := pool.readBody(r, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if c := len(*b.buf); c > growth<<minClassShift {
		t.Errorf("a buffer of %d bytes for 20 KB that arrived", c)
	}
}

// firstRead records the size of the buffer offered to its first Read.
type firstRead struct {
	r    io.Reader
	size chan int // buffered; gets one value
}

func (f *firstRead) Read(p []byte) (int, error) {
	select {
	case f.size <- len(p):
	default:
	}
	return f.r.Read(p)
}

func newFirstRead(r io.Reader) *firstRead { return &firstRead{r: r, size: make(chan int, 1)} }

// TestReadBodyDeclaredAtOnce: a body declared at up to preallocMax bytes is read into a buffer
// of its full length from the first read (no growth copies), while the budget for buffers
// taken ahead of their bytes lasts; past it, a body grows as its bytes arrive, and the budget
// comes back when a body has been read.
func TestReadBodyDeclaredAtOnce(t *testing.T) {
	pool := bodyPool{budget: 256 << 10}
	read := func(r *http.Request) {
		t.Helper()
		b, status, err := pool.readBody(r, 1<<20)
		if err != nil {
			t.Errorf("status %d: %v", status, err)
			return
		}
		b.Release()
	}
	declared := func(body io.Reader, n int) (*http.Request, *firstRead) {
		f := newFirstRead(body)
		r := httptest.NewRequest(http.MethodPost, "/", f)
		r.ContentLength = int64(n)
		return r, f
	}

	// A slow client holds 256 KiB of the budget while its body has not arrived.
	pr, pw := io.Pipe()
	slow, slowFirst := declared(pr, 200_000)
	done := make(chan struct{})
	go func() { defer close(done); read(slow) }()
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF); <-done })
	if got := <-slowFirst.size; got < 200_000 {
		t.Fatalf("a 200,000-byte body was offered %d bytes to read first, want its full length", got)
	}
	if got := pool.ahead.Load(); got != 256<<10 {
		t.Fatalf("%d bytes of the budget taken, want 256 KiB", got)
	}

	// Meanwhile another body finds the budget spent: it grows from the smallest buffer.
	want := bytes.Repeat([]byte("x"), 100_000)
	r, first := declared(iotest.HalfReader(bytes.NewReader(want)), len(want))
	read(r)
	if got := <-first.size; got != 1<<minClassShift {
		t.Errorf("with the budget spent, the first read was offered %d bytes, want %d", got, 1<<minClassShift)
	}

	// The slow body arrives; its share of the budget comes back, and the next body is read
	// at its full length at once again.
	go func() { pw.Write(make([]byte, 200_000)); pw.Close() }()
	testutil.Recv(t, done, "the slow body read")
	if got := pool.ahead.Load(); got != 0 {
		t.Fatalf("%d bytes of the budget still taken after every body was read", got)
	}
	r, first = declared(bytes.NewReader(want), len(want))
	read(r)
	if got := <-first.size; got < len(want) {
		t.Errorf("the first read was offered %d bytes of a %d-byte body", got, len(want))
	}

	// A body that fails half-way gives its share back too.
	r, _ = declared(io.MultiReader(bytes.NewReader(want[:10]), iotest.ErrReader(io.ErrUnexpectedEOF)), len(want))
	if _, status, _ := pool.readBody(r, 1<<20); status != http.StatusBadRequest {
		t.Errorf("status %d for a broken body, want 400", status)
	}
	if got := pool.ahead.Load(); got != 0 {
		t.Fatalf("%d bytes of the budget still taken after a failed body", got)
	}
}

func TestReadBodyLimits(t *testing.T) {
	var pool bodyPool
	for _, tc := range []struct {
		name     string
		size     int
		declared int64
		status   int
	}{
		{"at the limit", 1000, -1, 0},
		{"one over, chunked", 1001, -1, http.StatusRequestEntityTooLarge},
		{"declared over", 10, 1001, http.StatusRequestEntityTooLarge},
		{"empty", 0, -1, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, tc.size)))
			r.ContentLength = tc.declared
			b, status, err := pool.readBody(r, 1000)
			if status != tc.status || (err == nil) != (tc.status == 0) {
				t.Fatalf("status %d, err %v; want %d", status, err, tc.status)
			}
			if b != nil {
				b.Release()
			}
		})
	}
	r := httptest.NewRequest(http.MethodPost, "/", iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, status, _ := pool.readBody(r, 1000); status != http.StatusBadRequest {
		t.Errorf("a broken body: status %d, want 400", status)
	}
}

func TestBodyReleasedOnce(t *testing.T) {
	var pool bodyPool
	b := pool.newBody(10)
	b.Retain()
	b.Release()
	if b.buf == nil {
		t.Fatal("recycled while held")
	}
	b.Release()
	if b.buf != nil {
		t.Fatal("not recycled after the last release")
	}
	defer func() {
		if recover() == nil {
			t.Error("a release too many did not panic")
		}
	}()
	b.Release()
}

// TestPooledBodyOutlivesEveryAttempt sends distinct bodies concurrently through a gateway whose
// pool scribbles over every buffer it gets back, to a worker that answers 503 before reading the
// body (so the request is retried) and one that answers 200 in full before reading it: for both,
// net/http may still be writing the body after the attempt returned. No worker may see a byte of
// a recycled buffer, and -race must see no access to one.
func TestPooledBodyOutlivesEveryAttempt(t *testing.T) {
	models := func(w http.ResponseWriter) { fmt.Fprint(w, `{"data":[{"id":"m","owned_by":"sglang"}]}`) }
	refuser := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			models(w)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer refuser.Close()
	var mu sync.Mutex
	var got []string
	early := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			models(w)
			return
		}
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
		w.(http.Flusher).Flush()
		// The gateway may close the upstream request once it has the whole answer, so the body
		// can arrive cut short; what arrives must be the body as sent.
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
	}))
	defer early.Close()
	g := newTestGateway(t, Config{}, "round_robin")
	g.bodies.scribble = true
	for _, u := range []string{refuser.URL, early.URL} {
		g.mustRegister(t, AddWorkerRequest{URL: u})
	}
	const n = 40
	var wg sync.WaitGroup
	sent := make([]string, n)
	for i := range n {
		sent[i] = fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%d %s"}]}`, i, strings.Repeat("x", 20_000+i*1000))
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(g.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(sent[i]))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: status %d", i, resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	g.waitDone(t, n)
	early.Close() // waits for its handlers, so every body it read is recorded
	mu.Lock()
	defer mu.Unlock()
	if len(got) != n {
		t.Fatalf("the worker read %d bodies, want %d", len(got), n)
	}
	whole := 0
	for _, b := range got {
		if !slices.ContainsFunc(sent, func(s string) bool { return strings.HasPrefix(s, b) }) {
			t.Fatalf("the worker got %d bytes that are no prefix of a body sent", len(b))
		}
		if slices.Contains(sent, b) {
			whole++
		}
	}
	t.Logf("%d of %d bodies arrived whole", whole, n)
}
