package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/policy"
)

// Who sees the audit headers, and what they show.
//
// The headers say which worker served a request and how much of its prompt the policy expected
// cached. Shown to everyone, they let any client map the fleet and probe which prompts other
// users sent (a prefix a worker holds raises the predicted share). So with Config.AuditHeaders on
// they go only to a request that carries the admin key, or a data-plane key whose name is listed
// in Config.AuditHeadersClients; every other response carries none. And what they show is
// blunted:
//
//   - x-kvgate-worker is opaque: the first 16 hex digits of HMAC-SHA256(key, worker id), with
//     Config.AuditIDKey as the key, or a random key drawn when the process starts (so ids differ
//     between replicas and restarts; configure one key on every replica for ids that agree). Its
//     worker id being a hash of the URL, a plain hash would be inverted by trying the fleet's
//     few thousand plausible addresses; a keyed one cannot be without the key. The admin API
//     shows each worker's audit id (WorkerInfo.AuditID) for whoever must map them back.
//   - x-kvgate-predicted-hit is rounded to tenths. That hides the one-character steps that a
//     series of probes one token longer each would read off three decimals; it does not stop a
//     client that shapes its probes' lengths around a rounding boundary, which is why the
//     headers are for trusted clients only.

// auditIDs turns worker ids into the opaque ids the audit headers show.
type auditIDs struct {
	key []byte
}

// minAuditIDKey is the shortest configured key accepted: shorter ones could be guessed.
const minAuditIDKey = 16

func newAuditIDs(key string) auditIDs {
	if key != "" {
		return auditIDs{key: []byte(key)}
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return auditIDs{key: k}
}

// of returns worker id's audit id.
func (a auditIDs) of(workerID string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(workerID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// terms returns t as the audit headers show it: the worker by its audit id, Ĉ rounded to tenths
// of the prompt (as the predicted share is), and the cost computed again from the rounded Ĉ, by
// the formula of policy.Terms.Cost (Terms.Formula), so that it does not give Ĉ back to the token.
func (a auditIDs) terms(t policy.Terms) policy.Terms {
	t.Worker = a.of(t.Worker)
	if t.Prompt > 0 && t.Rate > 0 {
		t.Cached = roundTenth(t.Cached/t.Prompt) * t.Prompt
		t.Cost = t.Formula()
	}
	return t
}

// roundTenth rounds a share to tenths, for the predicted-hit header.
func roundTenth(share float64) float64 { return math.Round(share*10) / 10 }

// auditAccess decides which requests get the audit headers.
type auditAccess struct {
	on      bool
	admin   keySet // the admin key; empty when none is set
	clients keySet // the secrets of the data-plane keys named in AuditHeadersClients
}

// newAuditAccess resolves the client names against the data-plane keys.
func newAuditAccess(cfg *Config, admin keySet) (auditAccess, error) {
	a := auditAccess{on: cfg.AuditHeaders, admin: admin}
	if !cfg.AuditHeaders {
		return a, nil
	}
	byName := map[string]string{}
	for _, k := range cfg.APIKeys {
		if a := parseAPIKey(k); a.name != "" {
			byName[a.name] = a.secret
		}
	}
	for _, n := range cfg.AuditHeadersClients {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		secret, ok := byName[n]
		if !ok {
			return a, fmt.Errorf("--audit-headers-clients: no data-plane key is named %q (name a key as --api-key NAME=SECRET)", n)
		}
		a.clients = append(a.clients, newKeySet(secret)...)
	}
	if a.admin.open() && a.clients.open() {
		return a, fmt.Errorf("--audit-headers: no client could see them: set --admin-key, or name the data-plane keys that may in --audit-headers-clients")
	}
	if k := cfg.AuditIDKey; k != "" && len(k) < minAuditIDKey {
		return a, fmt.Errorf("--audit-id-key: at least %d bytes, or none for a random one", minAuditIDKey)
	}
	return a, nil
}

// allows reports whether r's response may carry the audit headers.
func (a *auditAccess) allows(r *http.Request) bool {
	if !a.on {
		return false
	}
	tok := bearer(r)
	if tok == "" {
		return false
	}
	return (!a.admin.open() && a.admin.match(tok)) || (!a.clients.open() && a.clients.match(tok))
}
