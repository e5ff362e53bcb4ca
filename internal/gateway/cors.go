package gateway

import (
	"net/http"
	"strings"
)

// withCORS answers browsers for the origins in CORSAllowedOrigins: a preflight (OPTIONS with
// Access-Control-Request-Method) from an allowed origin gets 204 with the methods and the headers
// it asked for; a request from an allowed origin gets Access-Control-Allow-Origin. With no origins
// configured it adds nothing, so no page on another origin can read an answer.
func (s *Server) withCORS(next http.Handler) http.Handler {
	if len(s.cfg.CORSAllowedOrigins) == 0 {
		return next
	}
	anyOrigin := false
	allowed := map[string]bool{}
	for _, o := range s.cfg.CORSAllowedOrigins {
		o = strings.TrimRight(strings.TrimSpace(o), "/")
		anyOrigin = anyOrigin || o == "*"
		allowed[strings.ToLower(o)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		h := w.Header()
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		h.Add("Vary", "Origin")
		ok := anyOrigin || allowed[strings.ToLower(origin)]
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			m := r.Header.Get("Access-Control-Request-Method")
			if !ok || (m != http.MethodGet && m != http.MethodPost && m != http.MethodHead) {
				writeError(w, http.StatusForbidden, "cors_forbidden", "this origin or method is not allowed to call the gateway")
				return
			}
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Methods", "GET, POST")
			if rh := r.Header.Get("Access-Control-Request-Headers"); rh != "" && len(rh) <= 1024 && isHeaderList(rh) {
				h.Set("Access-Control-Allow-Headers", rh)
			}
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if ok {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
		}
		next.ServeHTTP(w, r)
	})
}

// isHeaderList reports whether s is a comma-separated list of header names (RFC 9110 tokens), so
// that it may be echoed in Access-Control-Allow-Headers.
func isHeaderList(s string) bool {
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return false
		}
		for i := 0; i < len(f); i++ {
			c := f[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
				return false
			}
		}
	}
	return true
}
