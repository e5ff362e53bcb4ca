package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/flow"
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

// apiKey is one data-plane key as configured: "SECRET", or "NAME=SECRET" to give it a name (the
// tenant flow control counts its requests under), or "NAME+priority=SECRET" to also let its
// clients choose their requests' priority. A key whose text before its first '=' is not a
// valid name, or whose text after it is only '=' (base64 padding), is a secret as a whole; a
// leading '=' ("=SECRET") keeps a secret containing '=' whole.
type apiKey struct {
	name        string
	setPriority bool
	secret      string
}

// parseAPIKey splits a configured data-plane key.
func parseAPIKey(s string) apiKey {
	if strings.HasPrefix(s, "=") {
		return apiKey{secret: s[1:]}
	}
	head, secret, ok := strings.Cut(s, "=")
	if !ok || strings.Trim(secret, "=") == "" {
		return apiKey{secret: s}
	}
	name, perm, hasPerm := strings.Cut(head, "+")
	if !flow.ValidTenantName(name) || (hasPerm && perm != "priority") {
		return apiKey{secret: s}
	}
	return apiKey{name: name, setPriority: hasPerm, secret: secret}
}

// apiKeySecrets returns the secrets of keys, for the keySet that checks them.
func apiKeySecrets(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = parseAPIKey(k).secret
	}
	return out
}

// keyIdentities holds who each data-plane key is: its digest, name and permission. Like keySet,
// it compares every key's digest in constant time.
type keyIdentities struct {
	digests keySet
	keys    []apiKey // secret cleared
}

func newKeyIdentities(keys []string) keyIdentities {
	var ki keyIdentities
	for _, k := range keys {
		a := parseAPIKey(k)
		if a.secret == "" {
			continue
		}
		ki.digests = append(ki.digests, sha256.Sum256([]byte(a.secret)))
		a.secret = ""
		ki.keys = append(ki.keys, a)
	}
	return ki
}

// lookup returns the name and the priority permission of the key got; "" and false for no key or
// an unnamed one.
func (ki *keyIdentities) lookup(got string) (name string, setPriority bool) {
	if len(ki.digests) == 0 || got == "" {
		return "", false
	}
	g := sha256.Sum256([]byte(got))
	at := -1
	for i := range ki.digests {
		if subtle.ConstantTimeCompare(g[:], ki.digests[i][:]) == 1 {
			at = i
		}
	}
	if at < 0 {
		return "", false
	}
	return ki.keys[at].name, ki.keys[at].setPriority
}
