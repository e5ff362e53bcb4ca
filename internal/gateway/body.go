package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// readBody reads the whole body once, into a buffer sized from Content-Length when known.
func readBody(r *http.Request, max int64) ([]byte, int, error) {
	if r.ContentLength > max {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, max)
	}
	var buf []byte
	if r.ContentLength > 0 {
		buf = make([]byte, 0, r.ContentLength+1) // +1 so ReadAll sees EOF without growing
	} else {
		buf = make([]byte, 0, 4096)
	}
	lr := io.LimitedReader{R: r.Body, N: max + 1}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			if r.Context().Err() != nil {
				return nil, 499, err
			}
			return nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
		}
	}
	if int64(len(buf)) > max {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds the limit of %d bytes", max)
	}
	if len(buf) == 0 {
		return nil, http.StatusBadRequest, errors.New("the request body is empty")
	}
	return buf, 0, nil
}
