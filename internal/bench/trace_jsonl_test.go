package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseTrace(t *testing.T) {
	in := `# a comment
{"arrival": 0, "prompt": "hello world", "output_tokens": 8}

{"arrival": 0.5, "prompt_tokens": 100, "prefix_id": "sys-1", "prefix_tokens": 60, "session": "u1"}
{"arrival": 1.5, "prompt_tokens": 80, "prefix_id": "sys-1", "prefix_tokens": 60}
{"arrival": 2, "prompt_tokens": 10, "prefix_id": "sys-2"}
`
	es, err := ParseTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 4 {
		t.Fatalf("%d entries", len(es))
	}
	if es[1].OutputTokens != 64 {
		t.Fatalf("default output tokens %d, want 64", es[1].OutputTokens)
	}
	tr := NewTrace(es, 1)
	s0, _ := tr.Session(0)
	if s0.Turns[0].Text() != "hello world" || s0.Turns[0].OutputTokens != 8 || !s0.Timed || s0.At != 0 {
		t.Fatalf("session 0: %+v", s0)
	}
	s1, _ := tr.Session(1)
	s2, _ := tr.Session(2)
	if s1.Key != "u1" || s1.At != 500*time.Millisecond {
		t.Fatalf("session 1 key %q at %v", s1.Key, s1.At)
	}
	w1, w2 := strings.Fields(s1.Turns[0].Text()), strings.Fields(s2.Turns[0].Text())
	if len(w1) != 100 || len(w2) != 80 {
		t.Fatalf("synthesized %d and %d words, want 100 and 80", len(w1), len(w2))
	}
	if strings.Join(w1[:60], " ") != strings.Join(w2[:60], " ") {
		t.Fatal("two requests with one prefix id do not share its 60 words")
	}
	if strings.Join(w1[:61], " ") == strings.Join(w2[:61], " ") {
		t.Fatal("tails are shared too")
	}
	s3, _ := tr.Session(3)
	if n := len(strings.Fields(s3.Turns[0].Text())); n != 10 {
		t.Fatalf("default prefix length: %d words, want 10", n)
	}
	if _, ok := tr.Session(4); ok {
		t.Fatal("session past the end")
	}
}

func TestParseTraceErrors(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"empty", "", "no requests"},
		{"bad json", `{"arrival": 0, "prompt": "x"`, "line 1: bad JSON"},
		{"unknown field", `{"arrival": 0, "prompt": "x", "tokens": 3}`, "unknown field"},
		{"no prompt", `{"arrival": 0}`, "needs prompt"},
		{"negative arrival", `{"arrival": -1, "prompt": "x"}`, "arrival"},
		{"out of order", "{\"arrival\": 2, \"prompt\": \"x\"}\n{\"arrival\": 1, \"prompt\": \"y\"}", "line 2: arrival 1 is before"},
		{"prefix tokens without id", `{"arrival": 0, "prompt_tokens": 5, "prefix_tokens": 2}`, "needs a prefix_id"},
		{"huge", `{"arrival": 0, "prompt_tokens": 99999999999}`, "out of range"},
		{"two values", `{"arrival": 0, "prompt": "x"} {"arrival": 0, "prompt": "y"}`, "more than one"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadTraceUnreadable(t *testing.T) {
	_, err := LoadTrace(filepath.Join(t.TempDir(), "missing.jsonl"), 1)
	if err == nil || !strings.Contains(err.Error(), "missing.jsonl") {
		t.Fatalf("err %v, want one naming the file", err)
	}
	p := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(p, []byte("{\"arrival\": 0, \"prompt\": \"ok\"}\nnot json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadTrace(p, 1)
	if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "bad.jsonl") {
		t.Fatalf("err %v, want one naming the file and line 2", err)
	}
}

func FuzzParseTraceLine(f *testing.F) {
	for _, s := range []string{
		`{"arrival": 0, "prompt": "hello"}`,
		`{"arrival": 1.5, "prompt_tokens": 100, "prefix_id": "a", "prefix_tokens": 50, "output_tokens": 3, "session": "s"}`,
		`{"arrival": -1}`, `{}`, `[]`, `null`, `{"arrival": 1e400, "prompt": "x"}`, `{"prompt_tokens": 1048577}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := ParseTraceLine(line)
		if err != nil {
			return
		}
		if e.Arrival < 0 || e.OutputTokens <= 0 || (e.Prompt == "" && e.PromptTokens <= 0) ||
			e.PromptTokens > maxTraceTokens || e.PrefixTokens > maxTraceTokens {
			t.Fatalf("accepted an invalid entry %+v", e)
		}
		tr := NewTrace([]TraceEntry{e}, 1)
		s, ok := tr.Session(0)
		if !ok || len(s.Turns) != 1 {
			t.Fatal("valid entry gives no session")
		}
		if e.Prompt == "" && len(strings.Fields(s.Turns[0].Text())) != e.PromptTokens {
			t.Fatalf("synthesized %d words, want %d", len(strings.Fields(s.Turns[0].Text())), e.PromptTokens)
		}
	})
}
