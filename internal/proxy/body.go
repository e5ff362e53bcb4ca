package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// BodyRef is told when the transport takes and lets go of a reader of a Request's Body, so that
// the caller may recycle the Body's memory once nothing reads it: Retain is called before each
// reader is handed to net/http, Release when net/http closes it, which may happen after Forward
// or Discard returned (a transport may still be writing the body of an attempt whose answer
// already came).
type BodyRef interface {
	Retain()
	Release()
}

// bodyReader is one attempt's reader of a Request's Body; its Close releases the attempt's
// hold (if any), once.
type bodyReader struct {
	bytes.Reader
	body   []byte
	ref    BodyRef
	closed atomic.Bool
}

func (r *bodyReader) Close() error {
	if r.closed.CompareAndSwap(false, true) && r.ref != nil {
		r.ref.Release()
	}
	return nil
}

// writeLimited writes up to lr.N of r's unread bytes to w straight from the body's memory, as
// lr (an io.LimitedReader over r) would have yielded them.
func (r *bodyReader) writeLimited(w io.Writer, lr *io.LimitedReader) (int64, error) {
	pos := len(r.body) - r.Len()
	rest := r.body[pos:]
	if int64(len(rest)) > lr.N {
		rest = rest[:lr.N]
	}
	n, err := w.Write(rest)
	_, _ = r.Seek(int64(n), io.SeekCurrent)
	lr.N -= int64(n)
	return int64(n), err
}

// setBody gives u a reader of req.Body (and a GetBody for net/http's own replays on a fresh
// connection), each holding req.BodyRef until net/http closes it.
func setBody(u *http.Request, req *Request) {
	u.ContentLength = int64(len(req.Body))
	if len(req.Body) == 0 {
		u.Body, u.GetBody = http.NoBody, nil
		return
	}
	open := func() io.ReadCloser {
		if req.BodyRef != nil {
			req.BodyRef.Retain()
		}
		r := &bodyReader{body: req.Body, ref: req.BodyRef}
		r.Reset(req.Body)
		return r
	}
	u.Body = open()
	u.GetBody = func() (io.ReadCloser, error) { return open(), nil }
}

// bodyConn is a plain connection to a worker that writes a request body held in memory
// straight from that memory. net/http hands a body of known length to the connection's
// ReadFrom behind an io.LimitedReader, which hides every shortcut: the generic copy allocates
// (and zeroes) a 32 KB buffer per request and copies the body through it.
type bodyConn struct{ net.Conn }

// ReadFrom implements io.ReaderFrom.
func (c bodyConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if br, ok := lr.R.(*bodyReader); ok {
			return br.writeLimited(c.Conn, lr)
		}
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// dialBodyConn wraps dial's connections in bodyConn.
func dialBodyConn(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return bodyConn{c}, nil
	}
}
