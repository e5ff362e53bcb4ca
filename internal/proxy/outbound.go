package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// HopHeader is the header in which each kvgate lists the gateways a request crossed (see
// Config.HopID).
const HopHeader = "X-Kvgate-Hop"

// setCredentials decides what reaches the worker of an upstream request u, whose client headers
// are already copied: the client's Authorization (a key for this gateway, not for the worker) is
// removed unless forwarded on purpose; the worker's own key, when it has one, is sent instead,
// else the user and password of its URL as basic credentials (as http.Client would send them);
// and this gateway's hop id is appended so that a request coming back to it is recognised.
func (f *Forwarder) setCredentials(u *http.Request, workerKey string) {
	h := u.Header
	if !f.cfg.ForwardClientAuth {
		h.Del("Authorization")
	}
	if workerKey != "" {
		h.Set("Authorization", "Bearer "+workerKey)
	}
	if ui := u.URL.User; ui != nil && h.Get("Authorization") == "" {
		pass, _ := ui.Password()
		u.SetBasicAuth(ui.Username(), pass)
	}
	if f.cfg.HopID != "" {
		if prior := h.Values(HopHeader); len(prior) > 0 {
			h.Set(HopHeader, strings.Join(prior, ", ")+", "+f.cfg.HopID)
		} else {
			h[HopHeader] = f.hop // shared: net/http only reads an outgoing request's header
		}
	}
}

// upstreamHeaders is room for the fields the gateway adds to a client's on every request
// (request id, X-Forwarded-For, idempotency mark, hop), so that the upstream header map is
// allocated once at its size. Credentials mostly take the place of the client's
// Authorization, and the client fields that are not copied (Content-Length, hop-by-hop) are
// counted in the client's number, so the hint seldom falls short (the map then grows once).
// It is not rounded up for safety: a map for at most 8 fields is one group, a larger hint
// allocates a table (Go's http.Client sends 4 fields: a hint of 10 cost 2 allocations and 400
// bytes more than the 8 the request needs, BenchmarkUpstreamRequest).
const upstreamHeaders = 4

// newUpstreamRequest returns a POST to the worker at base for path (a route beginning with "/",
// with the client's query after a "?"), with an empty header map sized for n fields. The URL is
// base with path appended, built field by field rather than printed and parsed again: the same
// URL (scheme, credentials, host, base path prefix, query as the client sent it) for a fraction
// of the work. A base path with an escaped form of its own (RawPath) takes the printed way, to
// keep its escaping exactly.
func newUpstreamRequest(ctx context.Context, base *url.URL, path string, n int) (*http.Request, error) {
	if base.RawPath != "" {
		u, err := http.NewRequestWithContext(ctx, http.MethodPost, base.String()+path, nil)
		if err == nil {
			u.URL.Fragment, u.URL.RawFragment = "", ""
			u.Header = make(http.Header, n)
		}
		return u, err
	}
	route, query, hasQuery := strings.Cut(path, "?")
	query, _, _ = strings.Cut(query, "#") // a request target may carry one; it is never sent
	if !strings.HasPrefix(route, "/") || strings.ContainsAny(route, "%#") {
		return nil, fmt.Errorf("proxy: invalid upstream path %q", route)
	}
	target := *base
	target.Path = base.Path + route
	target.RawQuery = query
	target.ForceQuery = hasQuery && query == ""
	target.Host = strings.TrimSuffix(base.Host, ":") // an empty port, as printing drops it
	// The fields http.NewRequestWithContext would set, without parsing an empty URL only to
	// overwrite it and allocating a header map only to replace it. WithContext copies the
	// request to the heap once; this one stays on the stack.
	r := http.Request{
		Method:     http.MethodPost,
		URL:        &target,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, n),
		Host:       target.Host,
	}
	return r.WithContext(ctx), nil
}

// smallBody is the largest request body sent from a copy of its own (setSmallBody) rather than
// from the caller's memory (setBody).
const smallBody = 16 << 10

// setSmallBody gives u a copy of body in a reader net/http knows to be in memory, so that it
// writes the request's headers and body to the worker together, in one system call and one TCP
// segment where they fit its buffer. Of any other reader (setBody's, which must tell the
// caller when net/http lets go of it) net/http flushes the headers first, in case the body is
// slow to come: a second write, each costing more CPU on both sides of the connection than
// copying a few KB does. The copy is the request's own, so the caller's buffer is not held.
func setSmallBody(u *http.Request, body []byte) {
	u.ContentLength = int64(len(body))
	if len(body) == 0 {
		u.Body, u.GetBody = http.NoBody, nil
		return
	}
	b := bytes.Clone(body)
	u.Body = io.NopCloser(bytes.NewReader(b))
	u.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}
