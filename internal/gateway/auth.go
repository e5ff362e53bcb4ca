package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net/http"
	"strings"
)

// keySet holds the keys a plane accepts, as SHA-256 digests: comparing digests of fixed length in
// constant time reveals neither a key's bytes nor its length, and no key is kept in clear text
// in the gateway's memory past New.
type keySet [][sha256.Size]byte

func newKeySet(keys ...string) keySet {
	var ks keySet
	for _, k := range keys {
		if k != "" {
			ks = append(ks, sha256.Sum256([]byte(k)))
		}
	}
	return ks
}

// open reports whether the set is empty: no key is required.
func (ks keySet) open() bool { return len(ks) == 0 }

// match reports whether got is one of the keys. Every key is compared, whichever matches, so the
// time taken does not say which one did.
func (ks keySet) match(got string) bool {
	g := sha256.Sum256([]byte(got))
	ok := 0
	for i := range ks {
		ok |= subtle.ConstantTimeCompare(g[:], ks[i][:])
	}
	return ok == 1
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header, or "".
func bearer(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

// requireKey answers 401 unless the request carries one of ks (or ks is empty).
func requireKey(ks keySet, code, msg string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ks.open() && !ks.match(bearer(r)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvgate"`)
			writeError(w, http.StatusUnauthorized, code, msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) clientAuth(next http.Handler) http.Handler {
	return requireKey(s.apiKeys, "invalid_api_key", "missing or invalid API key", next)
}

// adminAuth guards an admin route: with an admin key the key decides; without one only a
// loopback Host and Origin pass (adminguard.go).
func (s *Server) adminAuth(next http.Handler) http.Handler {
	if s.adminKeys.open() {
		return loopbackOnly(next)
	}
	return requireKey(s.adminKeys, "invalid_admin_key", "missing or invalid admin key", next)
}

// requireJSON answers 415 unless the request body is declared as application/json. An admin write
// in any other type is refused so that a web page cannot send one from a visitor's browser: a
// cross-site form or text/plain fetch needs no CORS preflight, application/json does.
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "admin writes must be sent as Content-Type: application/json")
			return
		}
		next.ServeHTTP(w, r)
	})
}
