package gateway

import (
	"errors"
	"io"
)

// errTooLarge and errEmptyBody are readBody's errors for a body over its limit, and for none.
var (
	errTooLarge  = errors.New("request body too large")
	errEmptyBody = errors.New("the request body is empty")
)

// readBody reads src to its end into a buffer that grows as bytes arrive, never from a declared
// length: a client that declares a large body and sends a few bytes costs a few bytes. More than
// max bytes is errTooLarge.
func readBody(src io.Reader, max int64) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	lr := io.LimitedReader{R: src, N: max + 1}
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
			return nil, err
		}
	}
	if int64(len(buf)) > max {
		return nil, errTooLarge
	}
	if len(buf) == 0 {
		return nil, errEmptyBody
	}
	return buf, nil
}
