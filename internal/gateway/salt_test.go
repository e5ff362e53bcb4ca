package gateway

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/policy"
)

// Through the gateway, a prompt sent again under another cache_salt is predicted no hit
// (x-kvgate-predicted-hit 0, from the decision's recorded Ĉ), and under its own salt a hit; the
// salt shows in no header and no log line, debug and access lines included.
func TestSaltedRequestsThroughGateway(t *testing.T) {
	g, _ := newAuditGateway(t, Config{AuditHeaders: true, AccessLogSample: 1}, "cache_aware_hash", policy.DefaultConfig(), 3)
	var logs bytes.Buffer
	g.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	text := strings.Repeat("a long shared system prompt for salted tenants. ", 40)
	send := func(salt string) (predicted string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","cache_salt":%q,"messages":[{"role":"user","content":%q}]}`, salt, text)
		resp := g.post(t, "/v1/chat/completions", body)
		defer resp.Body.Close()
		g.waitDone(t, 1)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		for k, vs := range resp.Header {
			if strings.Contains(k+strings.Join(vs, ","), "secret-salt") {
				t.Fatalf("the salt is in the header %s: %v", k, vs)
			}
		}
		return resp.Header.Get(headerPredicted)
	}
	send("secret-salt-a")
	if p := send("secret-salt-a"); p == "" || p == "0.0" {
		t.Fatalf("the same salt again: predicted %q, want a hit", p)
	}
	if p := send("secret-salt-b"); p != "0.0" {
		t.Fatalf("another salt: predicted %q, want 0", p)
	}
	if strings.Contains(logs.String(), "secret-salt") {
		t.Fatalf("the salt is in the logs:\n%s", logs.String())
	}
}
