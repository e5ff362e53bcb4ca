package proxy

import (
	"bytes"
	"log"
	"log/slog"
	"strings"
	"testing"
)

// TestStdLogDropsAWorkersStrayBytes: net/http's line about bytes on an idle connection reaches
// the log without those bytes; other lines of the standard logger are kept.
func TestStdLogDropsAWorkersStrayBytes(t *testing.T) {
	var out bytes.Buffer
	l := log.New(StdLog(slog.New(slog.NewTextHandler(&out, nil))), "", log.LstdFlags)
	l.Printf("Unsolicited response received on idle HTTP channel starting with %q; err=%v", `HTTP/1.1 200 OK\r\n\r\n{"secret":"another user's answer"}`, nil)
	l.Printf("http: TLS handshake error from 10.0.0.1:5: EOF")
	got := out.String()
	if strings.Contains(got, "secret") || !strings.Contains(got, "level=WARN") || !strings.Contains(got, "idle connection") {
		t.Errorf("the stray bytes' line: %q", got)
	}
	if !strings.Contains(got, "TLS handshake error") {
		t.Errorf("another line was lost: %q", got)
	}
}
