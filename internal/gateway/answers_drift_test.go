package gateway

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/policy"
)

// TestDriftTransitionsAreLoggedOnce: a worker's events index drifting and agreeing again is
// logged once per transition, however many answers report the same state; a worker that never
// drifted logs nothing.
func TestDriftTransitionsAreLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var s silentWorkers
	for _, d := range []policy.Drift{{}, {}, {Drifting: true, Count: 1}, {Drifting: true, Count: 1}, {Count: 1}, {Count: 1}, {Drifting: true, Count: 2}} {
		s.noteDrift(log, "w", d)
	}
	s.noteDrift(log, "quiet", policy.Drift{})
	out := buf.String()
	if n := strings.Count(out, "disagrees"); n != 2 {
		t.Errorf("%d drift lines, want 2 (one per start):\n%s", n, out)
	}
	if n := strings.Count(out, "agrees with its answers again"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "quiet") {
		t.Errorf("a worker that never drifted was logged:\n%s", out)
	}
}
