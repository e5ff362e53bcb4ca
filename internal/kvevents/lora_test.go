package kvevents

import (
	"slices"
	"testing"
	"time"
)

// named is a BlockStored of adapter name (id on its engine); a chain's first block lists the
// name among its extra keys, with the salt after it when there is one, as vLLM's do.
func named(e Event, name string, id int64, salt string) Event {
	e.LoRAName, e.LoRA, e.HasLoRA = name, id, true
	if !e.HasParent {
		e.ExtraKeys = []string{name}
		if salt != "" {
			e.ExtraKeys = append(e.ExtraKeys, salt)
		}
	}
	return e
}

// An adapter's lookup meets exactly the blocks stored for that adapter by name, whatever id each
// engine gave it, with the blocks stored after them (child events); the base model's lookup
// meets none of them, nor does another adapter's; a chain that gives only an id is kept apart
// from everything, and its stream cannot answer an adapter's lookup; a salted adapter chain
// meets only that adapter under that salt.
func TestIndexKeysChainsByAdapter(t *testing.T) {
	x := NewIndex(100, 8)
	apply := func(w string, evs ...Event) {
		for i := range evs {
			evs[i] = decoded(t, evs[i])
		}
		x.Apply(Source{Worker: w, Model: "base"}, evs)
	}
	apply("a", named(stored([]uint64{1, 2}, 0, false, 4, 1), "sql", 1, ""), named(stored([]uint64{3}, 2, true, 4, 201), "sql", 1, ""))
	apply("b", named(stored([]uint64{11}, 0, false, 4, 1), "sql", 7, ""))
	apply("c", named(stored([]uint64{21, 22, 23}, 0, false, 4, 1), "chat", 1, ""))
	apply("d", stored([]uint64{31, 32}, 0, false, 4, 1))
	idOnly := stored([]uint64{41, 42, 43}, 0, false, 4, 1)
	idOnly.LoRA, idOnly.HasLoRA = 1, true
	apply("e", idOnly)
	apply("f", named(stored([]uint64{51, 52, 53}, 0, false, 4, 1), "sql", 2, "tenant"))
	toks := prompt(4, 1, 3)
	ids := []string{"a", "b", "c", "d", "f", "e"}
	out := make([]int, len(ids))
	now := time.Now()
	salt := SaltDigest([]byte("tenant"))
	for _, tc := range []struct {
		name, adapter string
		salted        bool
		want          []int
	}{
		{"sql", "sql", false, []int{12, 4, 0, 0, 0}},
		{"chat", "chat", false, []int{0, 0, 12, 0, 0}},
		{"base", "", false, []int{0, 0, 0, 8, 0}},
		{"unknown adapter", "other", false, []int{0, 0, 0, 0, 0}},
		{"sql salted", "sql", true, []int{0, 0, 0, 0, 12}},
		{"base salted", "", true, []int{0, 0, 0, 0, 0}},
	} {
		if !x.MatchAdapter("base", tc.adapter, salt, tc.salted, toks, ids[:5], out, now) || !slices.Equal(out[:5], tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, out[:5], tc.want)
		}
	}
	// The base model's Match is MatchAdapter without an adapter, and the id-only chain is not
	// the base model's.
	if !x.Match("base", toks, ids, out, now) || !slices.Equal(out, []int{0, 0, 0, 8, 0, 0}) {
		t.Errorf("Match: %v", out)
	}
	// A stream that stores adapters' blocks by id alone might hold any adapter's: a lookup for
	// an adapter that involves it cannot answer (the caller falls back to the adapter's tree).
	if x.MatchAdapter("base", "sql", 0, false, toks, ids, out, now) {
		t.Errorf("an adapter's lookup answered over a stream that names adapters by id alone")
	}
	// Streams are chosen by the model their topic names: the adapter's base.
	if x.MatchAdapter("sql", "sql", 0, false, toks, ids, out, now) {
		t.Errorf("streams of another model answered for the adapter")
	}
}

// An adapter's seed is neither the base model's nor a salt's of the same bytes.
func TestAdapterSeedApart(t *testing.T) {
	if AdapterSeed("") != keySeed || AdapterSeed("a") == keySeed || AdapterSeed("a") == saltSeed(keySeed, SaltDigest([]byte("a"))) || AdapterSeed("a") == AdapterSeed("b") {
		t.Fatal("adapter seeds collide")
	}
}
