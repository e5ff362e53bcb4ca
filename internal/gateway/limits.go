package gateway

import (
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/proxy"
)

// Limits bounds what one client connection or request may cost the gateway. Zero fields take
// DefaultLimits' values.
type Limits struct {
	// HeaderReadTimeout bounds reading a request's headers, so that a client sending them a
	// byte at a time cannot hold a connection. Default 10s.
	HeaderReadTimeout time.Duration
	// BodyReadTimeout bounds reading a request's whole body, from the end of its headers, so that
	// a client that declares a body and sends it slowly (or never) cannot hold a concurrency slot
	// for longer. Default 60s.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that carries no request for this long. Default
	// 120s.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps a request's header block (431 above). Default 64 KiB.
	MaxHeaderBytes int
	// MaxUpstreamHeaderBytes caps a worker's response header block; a worker sending more fails
	// the attempt (502). Default 64 KiB.
	MaxUpstreamHeaderBytes int64
}

// DefaultLimits returns the defaults: 10s to send headers, 60s to send a body, 120s idle, 64 KiB
// of request headers and 64 KiB of worker response headers.
func DefaultLimits() Limits {
	return Limits{
		HeaderReadTimeout:      10 * time.Second,
		BodyReadTimeout:        60 * time.Second,
		IdleTimeout:            120 * time.Second,
		MaxHeaderBytes:         64 << 10,
		MaxUpstreamHeaderBytes: 64 << 10,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.HeaderReadTimeout <= 0 {
		l.HeaderReadTimeout = d.HeaderReadTimeout
	}
	if l.BodyReadTimeout <= 0 {
		l.BodyReadTimeout = d.BodyReadTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MaxUpstreamHeaderBytes <= 0 {
		l.MaxUpstreamHeaderBytes = d.MaxUpstreamHeaderBytes
	}
	return l
}

// ConfigureServer applies the connection limits (header read timeout, idle timeout, header size)
// to srv, which serves this gateway's Handler or AdminHandler.
func (s *Server) ConfigureServer(srv *http.Server) {
	l := s.cfg.Limits
	srv.ReadHeaderTimeout = l.HeaderReadTimeout
	srv.IdleTimeout = l.IdleTimeout
	srv.MaxHeaderBytes = l.MaxHeaderBytes
}

// bodyError is a request body the gateway will not take, with the status that says why.
type bodyError struct {
	status int
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

// readRequestBody reads the whole body under the body read deadline into a pooled Body (which
// the caller must Release), decompressing a gzip body, with at most MaxPayloadSize bytes after
// decompression. On success the request's Content-Encoding is removed: the body is forwarded
// decompressed. The errors are *bodyError.
func (s *Server) readRequestBody(w http.ResponseWriter, r *http.Request) (*Body, error) {
	max := s.cfg.MaxPayloadSize
	if r.ContentLength > max {
		return nil, &bodyError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, max)}
	}
	gz := false
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		gz = true
	default:
		return nil, &bodyError{http.StatusUnsupportedMediaType, "unsupported Content-Encoding: only gzip and identity are accepted"}
	}
	// The deadline is lifted again once the body is read: the connection's reads after that
	// only watch for the client leaving, and must not end a long response. After a failure it
	// stays, and the connection is closed after the answer: net/http would otherwise wait for
	// the rest of the body before answering.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(s.cfg.Limits.BodyReadTimeout)) == nil
	fail := func(status int, err error) (*Body, error) {
		w.Header().Set("Connection", "close")
		if errors.Is(err, errBodyBudget) {
			w.Header().Set("Retry-After", budgetRetryAfter)
		}
		return nil, s.bodyReadError(r, status, err, gz)
	}
	if gz {
		in := &countingReader{r: io.LimitReader(r.Body, max+1)}
		zr, err := gzip.NewReader(in)
		if err != nil {
			return fail(http.StatusBadRequest, err)
		}
		// The pooled reader sees the decompressed stream; its length is unknown.
		r.Body = struct {
			io.Reader
			io.Closer
		}{&inflateLimit{zr: zr, in: in}, r.Body}
		r.ContentLength = -1
	}
	b, status, err := s.bodies.readBody(r, max)
	if err != nil {
		return fail(status, err)
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if gz {
		r.Header.Del("Content-Encoding")
	}
	return b, nil
}

// bodyReadError maps a failure to read the body (with the status readBody gave it) to the
// client's answer.
func (s *Server) bodyReadError(r *http.Request, status int, err error, gz bool) error {
	switch {
	case errors.Is(err, errBodyBudget):
		return &bodyError{http.StatusServiceUnavailable, "the gateway holds as many request bodies as its memory budget allows; retry shortly"}
	case errors.Is(err, errInflateRatio):
		return &bodyError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the gzip request body expands more than %d times", maxInflateRatio)}
	case status == http.StatusRequestEntityTooLarge:
		what := "the request body"
		if gz {
			what = "the decompressed request body"
		}
		return &bodyError{status, fmt.Sprintf("%s exceeds the limit of %d bytes", what, s.cfg.MaxPayloadSize)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &bodyError{http.StatusRequestTimeout, fmt.Sprintf("the request body was not received within %v", s.cfg.Limits.BodyReadTimeout)}
	case status == StatusClientClosed || r.Context().Err() != nil:
		return &bodyError{StatusClientClosed, "the client went away"}
	case gz && !errors.Is(err, errEmptyBody):
		return &bodyError{http.StatusBadRequest, "the request body is not valid gzip"}
	}
	return &bodyError{http.StatusBadRequest, err.Error()}
}

// A gzip body may expand at most maxInflateRatio times (after its first inflateFloor bytes):
// more is a decompression bomb, answered 413 before it fills a buffer, whatever the payload
// cap. Without this, a client stalling half-way through a few KiB of compressed zeros would
// hold megabytes of buffer per connection. Apache's DeflateInflateRatioLimit is 200 too; JSON
// prompts compress about 3 to 10 times.
const (
	maxInflateRatio = 200
	inflateFloor    = 64 << 10
)

var errInflateRatio = errors.New("the gzip body expands too much")

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// inflateLimit fails a decompressed stream that grows beyond maxInflateRatio times its input.
type inflateLimit struct {
	zr  io.Reader
	in  *countingReader
	out int64
}

func (l *inflateLimit) Read(p []byte) (int, error) {
	n, err := l.zr.Read(p)
	l.out += int64(n)
	if l.out > inflateFloor && l.out > maxInflateRatio*l.in.n {
		return n, errInflateRatio
	}
	return n, err
}

// HopHeader lists the gateways a request has passed through. Each kvgate adds its own random id
// when forwarding; a request that arrives carrying this gateway's id has looped back to it (a
// worker registered at the gateway's own address, or two gateways pointing at each other).
const HopHeader = proxy.HopHeader

// maxHops bounds the gateways one request may cross even when none of them sees itself twice.
const maxHops = 8

func newHopID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// looped reports whether r has passed through this gateway already, or through too many.
func (s *Server) looped(r *http.Request) bool {
	n := 0
	for _, v := range r.Header.Values(HopHeader) {
		for _, id := range strings.Split(v, ",") {
			n++
			if strings.TrimSpace(id) == s.hopID || n > maxHops {
				return true
			}
		}
	}
	return false
}
