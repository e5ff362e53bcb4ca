package main

import (
	"flag"
	"io"
	"testing"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// --worker-conn-reuse sets the default, a worker's conn_reuse label overrides it, and any other
// flag value is refused.
func TestWorkerConnReuseFlag(t *testing.T) {
	labelled := func(v string) *worker.Worker {
		return &worker.Worker{Spec: worker.Spec{Labels: map[string]string{gateway.ConnReuseLabel: v}}}
	}
	for _, c := range []struct {
		args               []string
		plain, never, alws bool
	}{
		{nil, true, false, true},
		{[]string{"--worker-conn-reuse", "never"}, false, false, true},
		{[]string{"--worker-conn-reuse", "always"}, true, false, true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var g gateway.Config
		hostileFlags(fs, &g)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if got := g.Proxy.ConnReuse(&worker.Worker{}); got != c.plain {
			t.Errorf("%v: unlabelled worker reuses %v, want %v", c.args, got, c.plain)
		}
		if g.Proxy.ConnReuse(labelled("never")) != c.never || g.Proxy.ConnReuse(labelled("always")) != c.alws {
			t.Errorf("%v: the label did not override the flag", c.args)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var g gateway.Config
	hostileFlags(fs, &g)
	if err := fs.Parse([]string{"--worker-conn-reuse", "sometimes"}); err == nil {
		t.Error("--worker-conn-reuse sometimes was accepted")
	}
}
