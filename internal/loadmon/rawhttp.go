package loadmon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// The raw client: polling is most of the monitor's cost, and most of a poll's cost is net/http's
// per-request machinery (two goroutines per connection and the hand-offs between them, request
// and header maps, a 4 KiB read buffer that splits a 30 KB /metrics page into many syscalls).
// For plain-http workers polled with the default client, the monitor therefore speaks the small
// subset of HTTP/1.1 a GET needs on a keep-alive connection it owns: one write, reads straight
// into the poll's buffer, Content-Length or chunked bodies. Anything outside that subset (a
// Content-Encoding, another Transfer-Encoding, a 1xx or 3xx answer) returns errRawUnsupported and the
// worker is polled through net/http from then on. TestPollCost measures the difference.

// errRawUnsupported says the raw client met HTTP it does not speak; the caller falls back.
var errRawUnsupported = errors.New("response outside the raw client's HTTP subset")

// errStaleConn is a reused keep-alive connection that the worker had closed before our request.
var errStaleConn = errors.New("stale keep-alive connection")

// maxHeader bounds a response's status line and headers.
const maxHeader = 64 << 10

// aLongTimeAgo is a deadline in the past: setting it interrupts a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// rawRequest builds the bytes of a GET for target (path and query) on host.
func rawRequest(host, target, apiKey string) []byte {
	b := fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvgate-loadmon\r\nAccept: */*\r\n", target, host)
	if apiKey != "" {
		b = fmt.Appendf(b, "Authorization: Bearer %s\r\n", apiKey)
	}
	return append(b, "\r\n"...)
}

// rawFetch sends request kind on the worker's connection (dialling one if needed) and returns
// the body. A reused connection found closed by the worker is replaced once.
func (m *Monitor) rawFetch(ctx context.Context, st *pollState, kind reqKind, sc *scratch) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		reused := st.conn != nil
		if !reused {
			c, err := m.dialer.DialContext(ctx, "tcp", st.addr)
			if err != nil {
				return nil, err
			}
			st.conn = c
		}
		body, keep, err := rawRoundTrip(ctx, st.conn, st.rawReqs[kind], sc, m.cfg.MaxBody)
		if err == nil && keep {
			return body, nil
		}
		st.conn.Close()
		st.conn = nil
		if err == nil {
			return body, nil
		}
		if reused && attempt == 0 && errors.Is(err, errStaleConn) && ctx.Err() == nil {
			continue
		}
		if ctx.Err() != nil && !errors.Is(err, errRawUnsupported) {
			return nil, ctx.Err()
		}
		return nil, err
	}
}

// rawRoundTrip writes req on c and reads the response, within ctx.
func rawRoundTrip(ctx context.Context, c net.Conn, req []byte, sc *scratch, limit int) (body []byte, keep bool, err error) {
	dl, _ := ctx.Deadline() // zero: no deadline
	if err := c.SetDeadline(dl); err != nil {
		return nil, false, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	defer stop()
	if _, err := c.Write(req); err != nil {
		return nil, false, fmt.Errorf("%w: %w", errStaleConn, err)
	}
	return readResponse(c, sc, limit)
}

// respReader reads one response from r into the scratch buffer.
type respReader struct {
	r     io.Reader
	buf   []byte
	limit int // body limit
	eof   bool
}

// more reads at least one more byte into buf, growing it (up to the body limit plus headers and
// chunk framing); io.ErrUnexpectedEOF if the peer closed.
func (rr *respReader) more() error {
	if rr.eof {
		return io.ErrUnexpectedEOF
	}
	if len(rr.buf) == cap(rr.buf) {
		if cap(rr.buf) > rr.limit+2*maxHeader {
			return ErrBodyTooLarge
		}
		rr.buf = append(rr.buf, make([]byte, max(cap(rr.buf), 16<<10))...)[:len(rr.buf)]
	}
	n, err := rr.r.Read(rr.buf[len(rr.buf):cap(rr.buf)])
	rr.buf = rr.buf[:len(rr.buf)+n]
	if err == io.EOF {
		rr.eof = true
		if n > 0 {
			return nil
		}
		return io.ErrUnexpectedEOF
	}
	return err
}

// readResponse reads a response to a GET: status 200 and its body, or an error. keep reports
// whether the connection may carry the next request.
func readResponse(r io.Reader, sc *scratch, limit int) (body []byte, keep bool, err error) {
	rr := respReader{r: r, buf: sc.buf[:0], limit: limit}
	defer func() { sc.keep(rr.buf) }()
	end := -1
	for end < 0 {
		if err := rr.more(); err != nil {
			if len(rr.buf) == 0 && !errors.Is(err, ErrBodyTooLarge) {
				err = fmt.Errorf("%w: %w", errStaleConn, err)
			}
			return nil, false, err
		}
		if end = bytes.Index(rr.buf, []byte("\r\n\r\n")); end < 0 && len(rr.buf) > maxHeader {
			return nil, false, errors.New("response header too large")
		}
	}
	h, err := parseHeader(rr.buf[:end+2])
	if err != nil {
		return nil, false, err
	}
	if h.status != 200 {
		return nil, false, &StatusError{Code: h.status} // the unread body goes with the connection
	}
	start := end + 4
	switch {
	case h.chunked:
		body, err = rr.chunked(start)
	case h.length >= 0:
		body, err = rr.fixed(start, h.length)
	default: // delimited by the connection's end
		h.keep = false
		body, err = rr.untilEOF(start)
	}
	if err != nil {
		return nil, false, err
	}
	return body, h.keep && !rr.eof, nil
}

// respHeader is what readResponse needs from a response's header.
type respHeader struct {
	status  int
	length  int64 // -1: none
	chunked bool
	keep    bool
}

func parseHeader(b []byte) (respHeader, error) {
	h := respHeader{length: -1, keep: true}
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return h, errors.New("malformed status line")
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 {
		return h, errors.New("malformed status code")
	}
	h.status, h.keep = code, line[7] == '1'
	if code < 200 || (code >= 300 && code < 400) {
		// 1xx, and redirects (Starlette answers /metrics with 307 to /metrics/ where the
		// Prometheus app is mounted): net/http handles both.
		return h, errRawUnsupported
	}
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || name[0] == ' ' || name[0] == '\t' {
			return h, errRawUnsupported // obsolete line folding or garbage: leave it to net/http
		}
		value = bytes.TrimSpace(value)
		switch {
		case keyIs(name, "content-length"):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (h.length >= 0 && h.length != n) {
				return h, errors.New("invalid Content-Length")
			}
			h.length = n
		case keyIs(name, "transfer-encoding"):
			if !keyIs(value, "chunked") {
				return h, errRawUnsupported
			}
			h.chunked = true
		case keyIs(name, "content-encoding"):
			if len(value) > 0 && !keyIs(value, "identity") {
				return h, errRawUnsupported
			}
		case keyIs(name, "connection"):
			if bytes.Contains(bytes.ToLower(value), []byte("close")) {
				h.keep = false
			}
		}
	}
	return h, nil
}

// fixed reads a body of n bytes starting at start.
func (rr *respReader) fixed(start int, n int64) ([]byte, error) {
	if n > int64(rr.limit) {
		return nil, ErrBodyTooLarge
	}
	for int64(len(rr.buf)-start) < n {
		if err := rr.more(); err != nil {
			return nil, err
		}
	}
	if int64(len(rr.buf)-start) > n {
		return nil, errors.New("data after the response body")
	}
	return rr.buf[start:], nil
}

// untilEOF reads a body delimited by the end of the connection.
func (rr *respReader) untilEOF(start int) ([]byte, error) {
	for !rr.eof {
		if err := rr.more(); err != nil && !rr.eof {
			return nil, err
		}
		if len(rr.buf)-start > rr.limit {
			return nil, ErrBodyTooLarge
		}
	}
	return rr.buf[start:], nil
}

// chunked decodes a chunked body in place: chunk data is moved down to follow the previous
// chunk's, so the body ends up contiguous from start.
func (rr *respReader) chunked(start int) ([]byte, error) {
	w, p := start, start // body written up to w; raw input read from p
	for {
		nl := bytes.Index(rr.buf[p:], []byte("\r\n"))
		if nl < 0 {
			if len(rr.buf)-p > 4<<10 {
				return nil, errors.New("chunk size line too long")
			}
			if err := rr.more(); err != nil {
				return nil, err
			}
			continue
		}
		sizeField, _, _ := bytes.Cut(rr.buf[p:p+nl], []byte(";")) // drop chunk extensions
		size, err := strconv.ParseUint(string(bytes.TrimSpace(sizeField)), 16, 63)
		if err != nil {
			return nil, errors.New("malformed chunk size")
		}
		if size == 0 {
			return rr.trailer(start, w, p+nl+2)
		}
		if uint64(w-start)+size > uint64(rr.limit) {
			return nil, ErrBodyTooLarge
		}
		data := p + nl + 2
		for uint64(len(rr.buf)-data) < size+2 {
			if err := rr.more(); err != nil {
				return nil, err
			}
		}
		end := data + int(size)
		if rr.buf[end] != '\r' || rr.buf[end+1] != '\n' {
			return nil, errors.New("malformed chunk end")
		}
		w += copy(rr.buf[w:], rr.buf[data:end])
		p = end + 2
	}
}

// trailer skips the trailer section after the last chunk (from p) and returns the body.
func (rr *respReader) trailer(start, w, p int) ([]byte, error) {
	for {
		nl := bytes.Index(rr.buf[p:], []byte("\r\n"))
		if nl < 0 {
			if len(rr.buf)-p > maxHeader {
				return nil, errors.New("trailer too large")
			}
			if err := rr.more(); err != nil {
				return nil, err
			}
			continue
		}
		if nl == 0 {
			if p+2 != len(rr.buf) {
				return nil, errors.New("data after the response body")
			}
			return rr.buf[start:w], nil
		}
		p += nl + 2
	}
}
