package gateway

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/kvgate/kvgate/internal/netaddr"
)

// The keyless admin plane and DNS rebinding.
//
// Without an admin key the admin routes trust whoever can connect, which is safe only because
// their listener is on loopback. A web page the operator visits can still reach a loopback port:
// with DNS rebinding its own name (evil.example) is made to resolve to 127.0.0.1, and the
// visitor's browser then sends the page's requests, same-origin in its eyes, to the admin plane,
// with "Host: evil.example" and "Origin: http://evil.example". So a keyless admin plane answers
// only a request whose Host names loopback (localhost, 127.0.0.0/8, [::1], any port) and whose
// Origin, when there is one, is loopback too: 421 for a foreign Host (the request was meant for
// another server), 403 for a foreign Origin. Tools (curl, kubectl port-forward, scripts) send
// "Host: 127.0.0.1:30001" or "localhost:30001" and no Origin, and are not affected. With an admin
// key the key alone decides: a browser cannot attach it to a rebound request.

// loopbackOnly answers 421 or 403 unless r's Host and Origin are both loopback (an absent
// Origin passes), then calls next.
func loopbackOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, "misdirected_request",
				"the admin plane without an admin key answers only requests addressed to localhost, 127.0.0.1 or [::1]")
			return
		}
		if o, sent := r.Header["Origin"]; sent && (len(o) != 1 || !loopbackOrigin(o[0])) {
			writeError(w, http.StatusForbidden, "forbidden_origin",
				"the admin plane without an admin key answers no request sent from a web page that is not on localhost")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether hostport (a Host header: a name or an address, with an optional
// port) names this machine's loopback interface. Only the name "localhost" itself counts among
// names: any other name is resolved by DNS, which is what an attacker controls.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.Contains(host, "%") { // a zone: fe80::1%eth0 is not loopback, ::1%lo needs no zone
		return false
	}
	h := netaddr.Parse(host)
	if !h.IP.IsValid() {
		return h.Name == "localhost"
	}
	return h.IP.IsLoopback()
}

// loopbackOrigin reports whether an Origin header ("scheme://host[:port]") is a page served from
// loopback. "null" (a sandboxed frame, a file:// page) is not.
func loopbackOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return false
	}
	return loopbackHost(u.Host)
}
