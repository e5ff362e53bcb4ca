package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// runCLI runs kvgate with args and returns what it wrote to stdout and stderr.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, _, err := runCLI(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.HasPrefix(out, "kvgate ") || !strings.Contains(out, runtime.Version()) || strings.Count(out, "\n") != 1 {
			t.Errorf("%v: got %q, want one line naming kvgate and %s", args, out, runtime.Version())
		}
	}
	if _, _, err := runCLI(t, "version", "extra"); err == nil {
		t.Error("version with an argument: want an error")
	}
}

func TestVersionString(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"}}
	for _, tc := range []struct {
		name   string
		linked string
		bi     *debug.BuildInfo
		ok     bool
		want   []string
		not    []string
	}{
		{"go install @tag", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, true, []string{"kvgate v0.4.0 go"}, []string{"revision"}},
		{"checkout", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs}, true,
			[]string{"kvgate (devel) revision 0123abcd (2026-12-01T10:00:00Z) with local changes"}, nil},
		{"release build", "v0.4.0", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs[:1]}, true,
			[]string{"kvgate v0.4.0 revision 0123abcd go"}, []string{"local changes", "(devel)"}},
		{"no build info", "", nil, false, []string{"kvgate (unknown) go"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := version
			version = tc.linked
			defer func() { version = old }()
			got := readBuildInfo(tc.bi, tc.ok).String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q, want it to contain %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("got %q, want no %q", got, n)
				}
			}
		})
	}
}

// kvgate_build_info names the build, so that a rollout can be followed in Prometheus.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := buildInfo{version: "v0.4.0", revision: "0123abcd"}
	if err := registerBuildInfo(reg, b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP kvgate_build_info Always 1; the labels say which kvgate build this is.
# TYPE kvgate_build_info gauge
kvgate_build_info{goversion="` + runtime.Version() + `",revision="0123abcd",version="v0.4.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvgate_build_info"); err != nil {
		t.Error(err)
	}
}

// help, -h and --help list every command with its one-line summary, not the serve flags.
func TestHelpListsCommands(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"-help"}} {
		out, errOut, err := runCLI(t, args...)
		if err != nil || errOut != "" {
			t.Fatalf("%v: err %v, stderr %q", args, err, errOut)
		}
		for _, c := range commandList() {
			if !strings.Contains(out, "  "+c.name) || !strings.Contains(out, c.summary) {
				t.Errorf("%v: the list lacks %s (%q)", args, c.name, c.summary)
			}
		}
		if strings.Contains(out, "-worker-urls") {
			t.Errorf("%v: the command list shows serve's flags", args)
		}
	}
}

// Every command's -h starts with a usage line and a description, then its flags; it is not an
// error (exit 0).
func TestCommandUsageHasDescription(t *testing.T) {
	for _, tc := range []struct{ cmd, about, flag string }{
		{"serve", "Runs the OpenAI-compatible gateway", "-worker-urls"},
		{"sim", "Serves --count simulated engines", "-base-port"},
		{"bench", "Runs a seeded workload", "-fleet"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			_, errOut, err := runCLI(t, tc.cmd, "-h")
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("err = %v, want flag.ErrHelp", err)
			}
			if !strings.HasPrefix(errOut, "usage: kvgate "+tc.cmd) || !strings.Contains(errOut, tc.about) || !strings.Contains(errOut, tc.flag) {
				t.Errorf("usage of %s:\n%s", tc.cmd, errOut)
			}
			if strings.Contains(errOut, "Usage of") {
				t.Errorf("the flag package's bare header is back:\n%s", errOut)
			}
			out, _, err := runCLI(t, "help", tc.cmd)
			if err != nil || !strings.Contains(out, tc.about) || !strings.Contains(out, tc.flag) {
				t.Errorf("help %s: err %v, output %q", tc.cmd, err, out)
			}
		})
	}
	if _, _, err := runCLI(t, "help", "nope"); err == nil {
		t.Error("help for an unknown command: want an error")
	}
}

// A mistyped flag is one line naming the closest flag, not a dump of every flag.
func TestUnknownFlagSuggests(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prt", "8080"}, "did you mean --port?"},
		{[]string{"serve", "-prt=8080"}, "did you mean --port?"},
		{[]string{"serve", "--prom", "1"}, "did you mean --prometheus-port?"},
		{[]string{"serve", "--polcy", "x"}, "did you mean --policy?"},
		{[]string{"sim", "--cont", "2"}, "did you mean --count?"},
		{[]string{"bench", "--fleat"}, "did you mean --fleet?"},
		{[]string{"serve", "--zzzzzzzz"}, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, err := runCLI(t, tc.args...)
			if err == nil {
				t.Fatal("want an error")
			}
			msg := err.Error()
			if !strings.Contains(msg, "flag provided but not defined") || !strings.Contains(msg, "-h lists the flags") {
				t.Errorf("error %q", msg)
			}
			if tc.want != "" && !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want %q", msg, tc.want)
			}
			if tc.want == "" && strings.Contains(msg, "did you mean") {
				t.Errorf("error %q suggests a flag nothing like the one typed", msg)
			}
			if out != "" || errOut != "" {
				t.Errorf("printed the flags on a typo: stdout %q stderr %q", out, errOut)
			}
		})
	}
	// A bad value is reported as such, with no suggestion.
	if _, _, err := runCLI(t, "serve", "--port", "x"); err == nil || strings.Contains(err.Error(), "did you mean") ||
		!strings.Contains(err.Error(), "invalid value") {
		t.Errorf("bad value: %v", err)
	}
}

func TestUnknownCommandSuggests(t *testing.T) {
	_, _, err := runCLI(t, "serv")
	if err == nil || !strings.Contains(err.Error(), "did you mean serve?") {
		t.Fatalf("got %v, want a suggestion of serve", err)
	}
}

func TestConfigUnknownKeySuggests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("prot: 8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCLI(t, "serve", "--config", path)
	if err == nil || !strings.Contains(err.Error(), `unknown key "prot" (did you mean port?)`) {
		t.Fatalf("got %v", err)
	}
}

func TestDidYouMean(t *testing.T) {
	names := []string{"port", "host", "policy", "prometheus-port", "prefill", "prefill-policy", "decode"}
	for _, tc := range []struct{ typed, want string }{
		{"prt", " (did you mean --port?)"},
		{"hots", " (did you mean --host?)"},
		{"prometheus", " (did you mean --prometheus-port?)"},
		{"prefil", " (did you mean --prefill?)"},
		{"pr", ""},        // too short to guess from
		{"xylophone", ""}, // nothing close
		{"", ""},
	} {
		if got := didYouMean(tc.typed, names, "--"); got != tc.want {
			t.Errorf("didYouMean(%q) = %q, want %q", tc.typed, got, tc.want)
		}
	}
	// Equally close candidates are all named, in order.
	if got := didYouMean("bat", []string{"cat", "bar", "zzz"}, ""); got != " (did you mean bar or cat?)" {
		t.Errorf("tie: got %q", got)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"port", "port", 0}, {"prt", "port", 1},
		{"kitten", "sitting", 3}, {"flaw", "lawn", 2}, {"hots", "host", 1}, {"prot", "port", 1}, {"ca", "abc", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// The distance is a metric's worth of sane: symmetric, zero only for equal strings, and between
// the length difference and the longer length.
func FuzzEditDistance(f *testing.F) {
	f.Add("prt", "port")
	f.Add("", "x")
	f.Add("prometheus-port", "prom")
	f.Fuzz(func(t *testing.T, a, b string) {
		d := editDistance(a, b)
		if d != editDistance(b, a) {
			t.Fatalf("asymmetric: %q %q", a, b)
		}
		if (d == 0) != (a == b) {
			t.Fatalf("d(%q, %q) = %d", a, b, d)
		}
		lo, hi := len(a)-len(b), max(len(a), len(b))
		if lo < 0 {
			lo = -lo
		}
		if d < lo || d > hi {
			t.Fatalf("d(%q, %q) = %d outside [%d, %d]", a, b, d, lo, hi)
		}
	})
}
