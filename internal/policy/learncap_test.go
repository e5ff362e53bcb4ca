package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// lruEngine is a prefix cache of whole prompts, least recently used first, of capacity tokens:
// what an engine with that much KV cache reports cached for a prompt sent again.
type lruEngine struct {
	capacity int
	order    []string // least recent first
	tokens   map[string]int
}

// serve returns the tokens the engine reports cached for text of tokens tokens, and caches it.
func (e *lruEngine) serve(text string, tokens int) int {
	if e.tokens == nil {
		e.tokens = map[string]int{}
	}
	cached := 0
	if i := slices.Index(e.order, text); i >= 0 {
		cached = tokens
		e.order = slices.Delete(e.order, i, i+1)
	}
	e.order = append(e.order, text)
	e.tokens[text] = tokens
	used := 0
	for _, t := range e.order {
		used += e.tokens[t]
	}
	for used > e.capacity {
		used -= e.tokens[e.order[0]]
		delete(e.tokens, e.order[0])
		e.order = e.order[1:]
	}
	return cached
}

// TestCapacityFollowsWhatTheEngineKeeps: one worker whose engine keeps 20 prompts of 250
// tokens; prompts come back at random distances, some after the engine let them go. The answers
// teach the tree the engine's capacity (within a factor of 2), after which a prompt the engine
// let go is predicted uncached while one it keeps is still predicted cached.
func TestCapacityFollowsWhatTheEngineKeeps(t *testing.T) {
	ws := cahWorkers(t, 1)
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	eng := &lruEngine{capacity: 20 * 250}
	text := func(i int) string { return prompt(i, strings.Repeat(fmt.Sprintf("turn %d ", i), 10)) }
	send := func(i int) (*Request, int) {
		req := &Request{Text: text(i)}
		w := Choose(context.Background(), p, ws, req)
		cached := eng.serve(req.Text, 250)
		p.Learn(req, Answer{Worker: w.ID, PromptTokens: 250, CachedTokens: cached})
		return req, cached
	}
	rng := rand.New(rand.NewPCG(1, 2))
	next := 0
	for range 400 {
		if next < 2 || rng.IntN(2) == 0 {
			send(next)
			next++
			continue
		}
		send(max(next-1-rng.IntN(min(next, 60)), 0))
	}
	capTokens := p.Capacities()[ws[0].ID]
	if capTokens < 20*250/2 || capTokens > 20*250*2 {
		t.Fatalf("learned capacity %.0f tokens, want the engine's 5,000 within a factor of 2", capTokens)
	}
	for range 30 { // 30 new prompts: the oldest of them are gone from the engine
		send(next)
		next++
	}
	old, cached := send(next - 30)
	if cached != 0 || old.Decision.Predicted > 0.5 {
		t.Fatalf("a prompt the engine let go: predicted %.2f cached, engine %d; want it predicted uncached", old.Decision.Predicted, cached)
	}
	recent, cached := send(next - 3)
	if cached == 0 || recent.Decision.Predicted < 0.5 {
		t.Fatalf("a prompt the engine keeps: predicted %.2f cached, engine %d; want it predicted cached", recent.Decision.Predicted, cached)
	}
}

// TestCapacityIgnoresScatteredLosses: an engine that loses a prompt now and then at any age
// (preemption under memory pressure) while holding older ones gets no capacity.
func TestCapacityIgnoresScatteredLosses(t *testing.T) {
	var c capacities
	for i := range 200 {
		age := float64(1000 + 97*i%5000)
		if c.observe("w", age, i%6 != 0) != 0 {
			t.Fatalf("answer %d: a capacity from losses outweighed by hits at every age", i)
		}
	}
	for range 4 {
		c.observe("w", 20000, false)
	}
	if got := c.observe("w", 30000, false); got < 5000 || got > 20000 {
		t.Fatalf("after losses past every hit: capacity %.0f, want between the oldest hit and the youngest loss", got)
	}
}

// TestCapacitiesAreBounded: a flood of worker ids keeps at most maxCalibrated of them.
func TestCapacitiesAreBounded(t *testing.T) {
	var c capacities
	for i := range maxCalibrated + 10 {
		c.observe(fmt.Sprint(i), 100, true)
	}
	if len(c.m) != maxCalibrated {
		t.Fatalf("%d workers kept, want %d", len(c.m), maxCalibrated)
	}
	c.forget("1")
	if len(c.m) != maxCalibrated-1 {
		t.Fatal("forget kept the worker")
	}
}
