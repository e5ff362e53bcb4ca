package main

import (
	"flag"
	"fmt"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// connReuseLabel is the worker label that overrides --worker-conn-reuse for one worker.
const connReuseLabel = "conn_reuse"

// hostileFlags registers the flags that bound what a hostile or broken worker, or a flood of
// large bodies, can do (docs/security.md).
func hostileFlags(fs *flag.FlagSet, g *gateway.Config) {
	g.Proxy.ConnReuse = connReuse(true)
	fs.Func("worker-conn-reuse", "always|never: whether a connection to a worker carries more than one request; a worker's "+connReuseLabel+" label overrides it. Use never for workers that echo no request id (docs/security.md)",
		func(v string) error {
			switch v {
			case "always":
				g.Proxy.ConnReuse = connReuse(true)
			case "never":
				g.Proxy.ConnReuse = connReuse(false)
			default:
				return fmt.Errorf("want always or never, not %q", v)
			}
			return nil
		})
}

// connReuse is the proxy's ConnReuse for a gateway-wide default: a worker's conn_reuse label
// ("always" or "never") wins; any other value of it leaves the default.
func connReuse(def bool) func(w *worker.Worker) bool {
	return func(w *worker.Worker) bool {
		switch w.Spec.Labels[connReuseLabel] {
		case "never":
			return false
		case "always":
			return true
		}
		return def
	}
}
