package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Change is one scheduled change of the worker set during a run: a removal or an addition. The
// live driver applies it through the gateway's admin API; the fleet simulator applies it to its
// engines (a removal drains, as DELETE /workers/{id} does; an addition is a new engine with an
// empty cache).
type Change struct {
	// At is when it happens, from the start of the run.
	At time.Duration
	// Remove is true for a removal, false for an addition.
	Remove bool
	// Arg says which worker: for a removal, an index ("3": the fourth worker, by URL order in a
	// live run, by engine index in the fleet simulator) or, live, a worker URL; "" means the
	// first. For an addition in a live run, the URL to add; the fleet simulator adds a new engine.
	Arg string
}

// Index returns the worker index a change names: Arg read as a non-negative integer, 0 when Arg
// is empty; ok is false when Arg is something else (a live run's URL).
func (c Change) Index() (i int, ok bool) {
	if c.Arg == "" {
		return 0, true
	}
	n, err := strconv.Atoi(c.Arg)
	return n, err == nil && n >= 0
}

// String returns c in the form ParseChanges reads.
func (c Change) String() string {
	verb := "add"
	if c.Remove {
		verb = "remove"
	}
	if c.Arg != "" {
		verb += ":" + c.Arg
	}
	return verb + "@" + c.At.String()
}

// ParseChanges parses a comma-separated schedule: "remove@60s", "remove:3@60s",
// "remove:http://127.0.0.1:31003@60s", "add@120s", "add:http://127.0.0.1:31008@120s". Changes
// must be in time order.
func ParseChanges(s string) ([]Change, error) {
	var out []Change
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		i := strings.LastIndexByte(f, '@')
		if i < 0 {
			return nil, fmt.Errorf("failover %q: want remove[:WHICH]@DURATION or add[:URL]@DURATION", f)
		}
		d, err := time.ParseDuration(f[i+1:])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("failover %q: bad time %q", f, f[i+1:])
		}
		verb, arg, _ := strings.Cut(f[:i], ":")
		c := Change{At: d, Arg: arg}
		switch verb {
		case "remove":
			c.Remove = true
		case "add":
		default:
			return nil, fmt.Errorf("failover %q: want remove[:WHICH]@DURATION or add[:URL]@DURATION", f)
		}
		if len(out) > 0 && d < out[len(out)-1].At {
			return nil, fmt.Errorf("failover %q comes before the previous change", f)
		}
		out = append(out, c)
	}
	return out, nil
}
