package main

import (
	"testing"

	"github.com/kvgate/kvgate/internal/sim"
)

// An adapter's request meets exactly its own adapter's blocks: three engines serving two
// adapters; engine 0 holds a prompt for the base model, engine 1 the same prompt for adapter
// "sql", engine 2 for adapter "chat", none of it seen by the gateway. The gateway sends each
// model's request for the prompt to the engine holding that model's blocks (the engines answer
// cached tokens only for the model's own blocks), and a third adapter's to none of them cached.
func TestPreciseRoutingKeysEventsByAdapter(t *testing.T) {
	r := startEventRigWith(t, 3, 1, func(c *sim.Config) {
		c.LoraModules = []sim.LoraModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat"}, {Name: "code", Path: "/adapters/code"}}
	})
	engines := r.fleet.URLs()
	p := longPrompt("shared")
	models := []string{sim.DefaultModel, "sql", "chat"}
	for i, m := range models {
		askModel(t, engines[i], m, p) // engine i holds the prompt for model i
	}
	r.sync(t)
	gw := "http://" + r.gateways[0]
	for i, m := range models {
		if c := askModel(t, gw, m, p); c < 600 {
			t.Fatalf("model %q: %d cached tokens, want engine %d's blocks of it", m, c, i)
		}
	}
	if c := askModel(t, gw, "code", p); c != 0 {
		t.Fatalf("adapter code was credited with %d cached tokens of the others' blocks", c)
	}
}
