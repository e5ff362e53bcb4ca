package proxy

import (
	"bytes"
	"io"
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
// hold, once.
type bodyReader struct {
	bytes.Reader
	ref    BodyRef
	closed atomic.Bool
}

func (r *bodyReader) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.ref.Release()
	}
	return nil
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
		if req.BodyRef == nil {
			return io.NopCloser(bytes.NewReader(req.Body))
		}
		req.BodyRef.Retain()
		r := &bodyReader{ref: req.BodyRef}
		r.Reset(req.Body)
		return r
	}
	u.Body = open()
	u.GetBody = func() (io.ReadCloser, error) { return open(), nil }
}
