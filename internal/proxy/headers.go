package proxy

import (
	"net/http"
	"net/textproto"
	"slices"
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

// connectionListed returns the canonical names of the fields h's Connection header lists (RFC
// 9110 §7.6.1), which are hop-by-hop too; nil when there is none. Clients such as Python's
// httpx send "Connection: keep-alive" on every request: the list is read once per header
// copy, not once per field.
func connectionListed(h http.Header) []string {
	var names []string
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				names = append(names, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	return names
}

// isHop reports whether field k is hop-by-hop, given the names its header's Connection lists.
func isHop(k string, listed []string) bool {
	return slices.Contains(hopHeaders, k) || slices.Contains(listed, k)
}

// copyRequestHeader copies the client's end-to-end headers into dst.
func copyRequestHeader(dst, src http.Header) {
	listed := connectionListed(src)
	for k, vs := range src {
		if skipRequest[k] || isHop(k, listed) {
			continue
		}
		dst[k] = vs
	}
}

// copyResponseHeader copies the worker's end-to-end headers into dst, keeping the gateway's own
// X-Request-Id.
func copyResponseHeader(dst, src http.Header) {
	listed := connectionListed(src)
	for k, vs := range src {
		if isHop(k, listed) || k == "X-Request-Id" {
			continue
		}
		dst[k] = vs
	}
}
