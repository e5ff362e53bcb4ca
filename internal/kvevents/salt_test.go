package kvevents

import (
	"bytes"
	"testing"
	"time"
)

// A chain whose first block carries a cache salt among its extra keys (newer vLLM) is keyed by
// it: a lookup under that salt meets it, one without a salt or under another does not, and an
// unsalted chain of the same tokens meets only unsalted lookups. The blocks stored after it (a
// child event naming it as parent) inherit its salt. The adapter's name among the extra keys is
// not taken for a salt: the adapter's chain is unsalted, and its own (lora.go).
func TestIndexKeysChainsBySalt(t *testing.T) {
	salt := SaltDigest([]byte("tenant-a"))
	x := NewIndex(100, 4)
	root := stored([]uint64{1, 2}, 0, false, 4, 1)
	root.ExtraKeys = []string{"tenant-a"}
	child := stored([]uint64{3}, 2, true, 4, 201)
	x.Apply(Source{Worker: "a"}, []Event{decoded(t, root), decoded(t, child)})
	x.Apply(Source{Worker: "b"}, []Event{stored([]uint64{11, 12}, 0, false, 4, 1)})
	lora := stored([]uint64{21}, 0, false, 4, 1)
	lora.LoRAName, lora.ExtraKeys = "adapter-1", []string{"adapter-1"}
	x.Apply(Source{Worker: "c"}, []Event{decoded(t, lora)})
	toks := prompt(4, 1, 3)
	ids := []string{"a", "b", "c"}
	out := make([]int, 3)
	if !x.MatchSalted("", salt, toks, ids, out, time.Now()) || out[0] != 12 || out[1] != 0 || out[2] != 0 {
		t.Fatalf("under the salt: %v, want [12 0 0]", out)
	}
	if !x.Match("", toks, ids, out, time.Now()) || out[0] != 0 || out[1] != 8 || out[2] != 0 {
		t.Fatalf("without a salt: %v, want [0 8 0]", out)
	}
	if !x.MatchAdapter("", "adapter-1", 0, false, toks, ids, out, time.Now()) || out[0] != 0 || out[1] != 0 || out[2] != 4 {
		t.Fatalf("the adapter, unsalted: %v, want [0 0 4]", out)
	}
	if !x.MatchSalted("", SaltDigest([]byte("tenant-b")), toks, ids, out, time.Now()) || out[0]+out[1]+out[2] != 0 {
		t.Fatalf("under another salt: %v, want none", out)
	}
}

// decoded round-trips e through both encodings and returns what Decode reads, which must agree.
func decoded(t *testing.T, e Event) Event {
	t.Helper()
	var got [2]Event
	for i, enc := range []Encoding{Legacy, Maps} {
		var buf bytes.Buffer
		if err := Encode(&buf, &Batch{TS: 1, Events: []Event{e}}, enc); err != nil {
			t.Fatal(err)
		}
		b, err := Decode(buf.Bytes())
		if err != nil || len(b.Events) != 1 {
			t.Fatalf("encoding %d: %v, %d events", enc, err, len(b.Events))
		}
		got[i] = b.Events[0]
	}
	if got[0].Salted != got[1].Salted || got[0].Salt != got[1].Salt || got[0].LoRAName != e.LoRAName {
		t.Fatalf("the encodings disagree: %+v and %+v", got[0], got[1])
	}
	return got[0]
}
