package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestBenchFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"nothing to measure", []string{"--rate", "1", "--requests", "1"}, "--target URL (live) or --fleet"},
		{"both", []string{"--target", "http://127.0.0.1:1", "--fleet", "--rate", "1", "--requests", "1"}, "not both"},
		{"unknown workload", []string{"--target", "http://127.0.0.1:1", "--workload", "nope", "--rate", "1", "--requests", "1"}, "unknown workload"},
		{"no arrivals", []string{"--target", "http://127.0.0.1:1", "--requests", "1"}, "set a rate"},
		{"unbounded", []string{"--target", "http://127.0.0.1:1", "--rate", "1"}, "bound the run"},
		{"bad trace", []string{"--target", "http://127.0.0.1:1", "--trace", "/nonexistent/t.jsonl"}, "/nonexistent/t.jsonl"},
		{"bad api", []string{"--target", "http://127.0.0.1:1", "--api", "x", "--model", "m", "--rate", "1", "--requests", "1"}, "chat or completions"},
		{"stray arg", []string{"--target", "http://127.0.0.1:1", "extra"}, "unexpected argument"},
		{"bad flag", []string{"--rate", "fast"}, "invalid value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), append([]string{"bench"}, tc.args...), &out, &errb)
			if err == nil {
				t.Fatal("want an error")
			}
			if msg := err.Error() + errb.String(); !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want one containing %q", msg, tc.want)
			}
		})
	}
}
