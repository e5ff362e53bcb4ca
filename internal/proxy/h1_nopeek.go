//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package proxy

// alive reports whether c, an idle connection, can take a request. Where a socket cannot be
// peeked without blocking it is taken to be alive: a request that then fails before any byte of
// an answer is sent again on a new connection.
func (c *h1Conn) alive() bool { return true }
