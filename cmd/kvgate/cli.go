package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// command is one subcommand of kvgate.
type command struct {
	name string
	// args follows the name in the usage line.
	args string
	// summary is the one line `kvgate help` shows.
	summary string
	// about is the paragraph under the usage line of `kvgate NAME -h`; "" keeps the flag set's
	// own Usage (bench writes its own).
	about string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commandList returns the subcommands in the order `kvgate help` shows them. (A function, not a
// package variable: help refers back to the list.)
func commandList() []command {
	return []command{
		{name: "serve", args: "[flags]", summary: "run the gateway (the default when no command is given)",
			about: `Runs the OpenAI-compatible gateway: the API on --host:--port, the admin API (/workers,
/get_loads) on --admin-host:--admin-port, Prometheus metrics on --prometheus-port. Workers come
from --worker-urls, --prefill/--decode, the admin API or Kubernetes discovery
(--service-discovery); with none of these it starts --sim-workers simulated engines, so that
a bare "kvgate" is a working demo. --config reads the same settings from a YAML file.`,
			run: runServe},
		{name: "sim", args: "[flags]", summary: "serve simulated inference engines on real ports",
			about: `Serves --count simulated engines (continuous batching, a KV prefix cache, SGLang and vLLM
load and metrics endpoints) on --host, ports --base-port, --base-port+1, ..., and prints one
URL per line: workers for trying the gateway, or a bench target, without GPUs.`,
			run: runSim},
		{name: "bench", args: "(--target URL | --fleet) [flags]", summary: "drive a workload against a live URL, or against a virtual-time fleet",
			run: runBench},
		{name: "version", summary: "print kvgate's version, VCS revision and Go version", run: runVersion},
		{name: "help", args: "[command]", summary: "list the commands, or show one command's flags", run: runHelp},
	}
}

func lookupCommand(name string) (command, bool) {
	commands := commandList()
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// run dispatches to a subcommand; with none (or a leading flag) it serves.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			return runHelp(ctx, nil, stdout, stderr)
		case "-version", "--version":
			return runVersion(ctx, args[1:], stdout, stderr)
		}
	}
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	c, ok := lookupCommand(name)
	if !ok {
		var names []string
		for _, c := range commandList() {
			names = append(names, c.name)
		}
		return fmt.Errorf("unknown command %q%s; kvgate help lists the commands", name, didYouMean(name, names, ""))
	}
	return c.run(ctx, args, stdout, stderr)
}

// runHelp prints the command list, or with a command name, that command's usage.
func runHelp(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		c, ok := lookupCommand(args[0])
		if !ok || c.name == "help" || c.name == "version" {
			return fmt.Errorf("help: no flags to show for %q; kvgate help lists the commands", args[0])
		}
		// The command prints its own usage, with every flag, for -h.
		err := c.run(context.Background(), []string{"-h"}, stdout, stdout)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	fmt.Fprint(stdout, `kvgate is an OpenAI-compatible gateway for fleets of LLM inference servers (SGLang, vLLM):
cache-aware routing on global load, streaming, health checks, retries, Kubernetes discovery.

usage: kvgate [command] [flags]

commands:
`)
	for _, c := range commandList() {
		fmt.Fprintf(stdout, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(stdout, `
"kvgate CMD -h" (or "kvgate help CMD") lists a command's flags; "kvgate --version" prints the
version. With no command kvgate serves, so "kvgate --port 8080" runs the gateway.
`)
	return nil
}

// version is the release, set at link time by release builds (-ldflags "-X main.version=v1.2.3",
// as the Dockerfile does). Empty means the module version from the build info: a tagged version
// for `go install ...@v1.2.3`, "(devel)" for a build from a checkout.
var version string

// buildInfo is what this binary knows of its own build.
type buildInfo struct {
	// version is the release (the -X main.version value, else the module version), or
	// "(unknown)" without build information.
	version string
	// revision, revTime and modified are the VCS revision, its commit time and whether the
	// checkout had local changes; revision is "" when the build did not record it.
	revision, revTime string
	modified          bool
}

// readBuildInfo reads the version and VCS revision from bi (debug.ReadBuildInfo: go build in a git
// checkout records them, unless -buildvcs=false) and the link-time version.
func readBuildInfo(bi *debug.BuildInfo, ok bool) buildInfo {
	b := buildInfo{version: version}
	if ok {
		if b.version == "" {
			b.version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.revision = s.Value
			case "vcs.time":
				b.revTime = s.Value
			case "vcs.modified":
				b.modified = s.Value == "true"
			}
		}
	}
	if b.version == "" {
		b.version = "(unknown)"
	}
	return b
}

// ownBuild is this binary's build information.
func ownBuild() buildInfo { return readBuildInfo(debug.ReadBuildInfo()) }

// String is the line `kvgate version` prints: version, revision with its time, and the Go
// toolchain.
func (b buildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "kvgate %s", b.version)
	if b.revision != "" {
		fmt.Fprintf(&s, " revision %s", b.revision)
		if b.revTime != "" {
			fmt.Fprintf(&s, " (%s)", b.revTime)
		}
		if b.modified {
			s.WriteString(" with local changes")
		}
	}
	fmt.Fprintf(&s, " %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return s.String()
}

// registerBuildInfo adds kvgate_build_info{version,revision,goversion} 1 to reg, the usual way
// to see in Prometheus which release each replica runs (during a rollout, for one).
func registerBuildInfo(reg prometheus.Registerer, b buildInfo) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "kvgate_build_info",
		Help:        "Always 1; the labels say which kvgate build this is.",
		ConstLabels: prometheus.Labels{"version": b.version, "revision": b.revision, "goversion": runtime.Version()},
	}, func() float64 { return 1 }))
}

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version: unexpected argument %q", args[0])
	}
	fmt.Fprintln(stdout, ownBuild())
	return nil
}

// parseFlags parses args into fs, the flag set of command fs.Name() ("serve", or "kvgate
// bench"). It gives every command the same behaviour: -h prints the command's usage (its
// description and flags) and returns flag.ErrHelp; a bad flag returns one error line, with "did
// you mean --NAME?" when a defined flag is close to an unknown one, instead of all the flags.
func parseFlags(fs *flag.FlagSet, args []string) error {
	name := strings.TrimPrefix(fs.Name(), "kvgate ")
	out := fs.Output()
	if c, ok := lookupCommand(name); ok && c.about != "" {
		fs.Usage = func() {
			fmt.Fprintf(out, "usage: kvgate %s %s\n\n%s\n\nflags:\n", c.name, c.args, c.about)
			fs.PrintDefaults()
		}
	}
	usage := fs.Usage
	// The flag package prints the error and the whole usage on a bad flag; we print one line.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	hint := ""
	if unknown, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		hint = didYouMean(strings.TrimPrefix(unknown, "-"), flagNames(fs), "--")
	}
	return fmt.Errorf("%s: %w%s; kvgate %s -h lists the flags", name, err, hint, name)
}

// flagNames returns the names of every flag fs defines.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// didYouMean returns " (did you mean PREFIXNAME?)" naming the candidates closest to typed (by
// edit distance, at most a third of its length; a candidate that typed begins counts as the
// farthest close one), or "" when none, or more than three, are close.
func didYouMean(typed string, candidates []string, prefix string) string {
	if typed == "" {
		return ""
	}
	limit := max(1, len(typed)/3)
	best, bestDist := []string(nil), limit+1
	for _, c := range candidates {
		d := editDistance(typed, c)
		if len(typed) >= 3 && strings.HasPrefix(c, typed) {
			d = min(d, limit) // "--prom" for "--prometheus-port", after any real typo
		}
		switch {
		case d > limit:
		case d < bestDist:
			best, bestDist = []string{c}, d
		case d == bestDist:
			best = append(best, c)
		}
	}
	if len(best) == 0 || len(best) > 3 {
		return ""
	}
	slices.Sort(best)
	for i := range best {
		best[i] = prefix + best[i]
	}
	return " (did you mean " + strings.Join(best, " or ") + "?)"
}

// editDistance is the optimal-string-alignment distance between a and b: insertions,
// deletions, substitutions and swaps of two neighbours ("hsot") each cost 1. Counted in bytes
// (flag names are ASCII); both are short, so three rows of len(b)+1 ints.
func editDistance(a, b string) int {
	if a == b {
		return 0
	}
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b)) // a pasted value, not a typo of a flag
	}
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
