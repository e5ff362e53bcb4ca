//go:build linux || darwin || freebsd || netbsd || openbsd

package proxy

import "syscall"

// alive reports whether c, an idle connection, can take a request: the worker has not closed it
// (a read would give end of file) nor sent anything unasked (an answer to no request, such as a
// 408, which comes before a close). It peeks without blocking and without consuming.
func (c *h1Conn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.raw == nil {
		return true
	}
	ok := false
	err := c.raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && ok
}
