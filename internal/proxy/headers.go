package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopHeaders are meaningful only for one connection and are never forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// skipRequest are client headers the gateway replaces itself.
var skipRequest = map[string]bool{
	"Content-Length": true, "Host": true, "X-Request-Id": true, "X-Forwarded-For": true,
}

func isHop(h http.Header, k string) bool {
	for _, hop := range hopHeaders {
		if k == hop {
			return true
		}
	}
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(f)) == k {
				return true
			}
		}
	}
	return false
}

// copyRequestHeader copies the client's end-to-end headers into dst.
func copyRequestHeader(dst, src http.Header) {
	for k, vs := range src {
		if skipRequest[k] || isHop(src, k) {
			continue
		}
		dst[k] = vs
	}
}

// copyResponseHeader copies the worker's end-to-end headers into dst, keeping the gateway's own
// X-Request-Id.
func copyResponseHeader(dst, src http.Header) {
	for k, vs := range src {
		if isHop(src, k) || k == "X-Request-Id" {
			continue
		}
		dst[k] = vs
	}
}
