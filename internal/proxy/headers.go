package proxy

import (
	"net/http"
	"net/textproto"
	"net/url"
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

// relayedHeaders are the worker response fields a client may see: what it needs to read the
// body, caching, rate limits and request ids. Anything else a worker sends (Set-Cookie, Server,
// Strict-Transport-Security, Alt-Svc, Link and Refresh with internal URLs, its own CORS
// answer: the gateway owns CORS) stays at the gateway. The X-Ratelimit- prefix is matched
// apart (relayedHeader).
var relayedHeaders = map[string]bool{
	"Content-Type": true, "Content-Encoding": true, "Content-Length": true, "Content-Language": true,
	"Cache-Control": true, "Expires": true, "Etag": true, "Last-Modified": true, "Vary": true, "Age": true, "Pragma": true,
	"Retry-After": true, "Retry-After-Ms": true,
	"Request-Id": true, "X-Correlation-Id": true,
	"Location": true, "Content-Location": true,
}

// relayedOnClose are the fields relayed from an answer that said "Connection: close": net/http
// folds that header into Response.Close and drops it, so the other fields it may have listed
// as hop-by-hop are unknown, and only those a client needs to read the answer (and to back off)
// pass.
var relayedOnClose = map[string]bool{
	"Content-Type": true, "Content-Encoding": true, "Content-Length": true, "Retry-After": true,
	"Location": true, "Content-Location": true,
}

// relayedHeader reports whether worker field k (canonical) may reach the client.
func relayedHeader(k string, closed bool) bool {
	if closed {
		return relayedOnClose[k]
	}
	return relayedHeaders[k] || strings.HasPrefix(k, "X-Ratelimit-")
}

// copyResponseHeader copies into dst the fields of the worker's answer resp that a client may
// see (relayedHeaders), never a hop-by-hop one nor one the worker's Connection lists (the
// gateway's own X-Request-Id is not among them). A worker's Vary adds to the gateway's (CORS varies on Origin).
// A worker's redirect is relayed, never followed (it could point past the hosts workers may live
// on), and its Location or Content-Location is cut to a reference relative to the gateway
// (relativeRef): an absolute URL there names the worker's internal address, which clients must
// never see.
func copyResponseHeader(dst http.Header, resp *http.Response) {
	src := resp.Header
	// An HTTP/1.1 "Connection: close" is gone from src by now (see relayedOnClose); an HTTP/1.0
	// answer keeps its Connection header, and Close is true for it without one.
	closed := resp.Close && resp.ProtoAtLeast(1, 1)
	listed := connectionListed(src)
	for k, vs := range src {
		if !relayedHeader(k, closed) || isHop(k, listed) {
			continue
		}
		switch k {
		case "Location", "Content-Location":
			vs = relativeRefs(vs)
		case "Vary":
			if prior := dst[k]; len(prior) > 0 {
				vs = append(slices.Clip(prior), vs...)
			}
		}
		dst[k] = vs
	}
}

// relativeRefs returns vs with every absolute URL (one with a scheme or a host) cut to its path,
// query and fragment, "/" when the path is empty; a value that does not parse becomes "/". It
// returns vs itself when nothing needed cutting (the common case: no such header at all).
func relativeRefs(vs []string) []string {
	var out []string
	for i, v := range vs {
		r := relativeRef(v)
		if r == v && out == nil {
			continue
		}
		if out == nil {
			out = slices.Clone(vs[:i])
		}
		out = append(out, r)
	}
	if out == nil {
		return vs
	}
	return out
}

func relativeRef(v string) string {
	u, err := url.Parse(v)
	if err != nil {
		return "/"
	}
	if u.Scheme == "" && u.Host == "" && u.User == nil && u.Opaque == "" {
		return oneLeadingSlash(v)
	}
	if u.Opaque != "" {
		return "/"
	}
	rel := url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery, Fragment: u.Fragment, RawFragment: u.RawFragment}
	if rel.Path == "" || rel.Path[0] != '/' {
		rel.Path, rel.RawPath = "/"+rel.Path, ""
	}
	return oneLeadingSlash(rel.String())
}

// oneLeadingSlash folds a leading run of slashes and backslashes into one slash: "//host/x" is
// a reference to another host, and browsers read "/\host" the same way.
func oneLeadingSlash(s string) string {
	n := 0
	for n < len(s) && (s[n] == '/' || s[n] == '\\') {
		n++
	}
	if n < 2 {
		return s
	}
	return "/" + s[n:]
}
