package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// logLines collects a logger's JSON lines.
type logLines struct {
	testutil.SyncBuffer
	read int // how much take has read
}

// take returns the lines logged since the last take whose msg starts with prefix.
func (l *logLines) take(prefix string) []map[string]any {
	all := l.String()
	fresh := all[l.read:]
	l.read = len(all)
	var out []map[string]any
	for _, line := range strings.Split(fresh, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(m["msg"].(string), prefix) {
			out = append(out, m)
		}
	}
	return out
}

// A model's policy never changes silently: each change is one log line naming the old and the new
// policy by canonical name and the worker whose label caused it; a label that switches a model
// already serving is a WARN, and a label that is not applied says so.
func TestPolicyChangesAreLogged(t *testing.T) {
	logs := &logLines{}
	g := newTestGateway(t, Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))}, "round_robin")
	f1, f2, f3 := newFakeWorker(t, "m"), newFakeWorker(t, "m"), newFakeWorker(t, "m")
	register := func(url, label string) string {
		t.Helper()
		a := AddWorkerRequest{URL: url}
		if label != "" {
			a.Labels = map[string]string{"policy": label}
		}
		w, err := g.Register(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		return w.ID
	}
	expect := func(step, level, prefix string, want map[string]any) {
		t.Helper()
		lines := logs.take(prefix)
		if len(lines) != 1 {
			t.Fatalf("%s: %d %q lines, want 1", step, len(lines), prefix)
		}
		if lines[0]["level"] != level {
			t.Errorf("%s: level %v, want %s", step, lines[0]["level"], level)
		}
		for k, v := range want {
			if lines[0][k] != v {
				t.Errorf("%s: %s = %v, want %v (line %v)", step, k, lines[0][k], v, lines[0])
			}
		}
	}
	register(f1.URL, "")
	expect("first worker", "INFO", "model policy", map[string]any{"model": "m", "policy": "round_robin", "reason": "the default policy (--policy)"})
	id2 := register(f2.URL, "cache-aware") // an alias, logged by its canonical name
	expect("label switches a serving model", "WARN", "model policy changed", map[string]any{
		"from": "round_robin", "policy": "cache_aware", "worker": id2, "url": f2.URL, "registered_by": "operator"})
	id3 := register(f3.URL, "random")
	expect("label not applied", "WARN", "worker's policy label not applied", map[string]any{"policy": "cache_aware", "label": "random", "worker": id3})
	if got := logs.take("model policy"); len(got) != 0 {
		t.Fatalf("a label that changed nothing logged a change: %v", got)
	}
	if _, err := g.reg.Remove(id2); err != nil {
		t.Fatal(err)
	}
	expect("labelled worker leaves", "WARN", "model policy changed", map[string]any{"from": "cache_aware", "policy": "random", "worker": id3})
	if _, err := g.reg.Remove(id3); err != nil {
		t.Fatal(err)
	}
	expect("last label leaves", "WARN", "model policy changed", map[string]any{"from": "random", "policy": "round_robin",
		"reason": "no worker of the model carries a policy label any more: back to the default (--policy)"})
}
