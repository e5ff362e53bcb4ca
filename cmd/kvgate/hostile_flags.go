package main

import (
	"flag"
	"fmt"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// hostileFlags registers the flags that bound what a hostile or broken worker, or a flood of
// large bodies, can do (docs/security.md).
func hostileFlags(fs *flag.FlagSet, g *gateway.Config) {
	fs.Int64Var(&g.BodyBudget.Bytes, "body-memory-budget", gateway.DefaultBodyBudgetBytes, "bytes of request bodies held in memory at once, gateway-wide (being read, queued or in flight, retries included); past it a request waits --body-budget-wait, then gets 503 with Retry-After (negative = no bound)")
	fs.DurationVar(&g.BodyBudget.Wait, "body-budget-wait", gateway.DefaultBodyBudgetWait, "how long a request body waits for room in --body-memory-budget before its request gets 503")
	g.Proxy.ConnReuse = connReuse(true)
	fs.Func("worker-conn-reuse", "always|never: whether a connection to a worker carries more than one request; a worker's "+gateway.ConnReuseLabel+" label overrides it. Use never for workers that echo no request id (docs/security.md)",
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
		switch w.Spec.Labels[gateway.ConnReuseLabel] {
		case "never":
			return false
		case "always":
			return true
		}
		return def
	}
}
