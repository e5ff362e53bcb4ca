package kvevents

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func sampleBatch() Batch {
	return Batch{TS: 1712345678.5, HasRank: true, Rank: 1, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{11, 1 << 63}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4},
		{Kind: BlockStored, Hashes: []uint64{12}, Parent: 11, HasParent: true, Tokens: []uint32{9, 9, 9, 9}, BlockSize: 4, LoRA: 3, HasLoRA: true},
		{Kind: BlockRemoved, Hashes: []uint64{12}},
		{Kind: AllBlocksCleared},
	}}
}

func TestEncodeDecodeBothEncodings(t *testing.T) {
	for _, enc := range []Encoding{Legacy, Maps} {
		want := sampleBatch()
		var buf bytes.Buffer
		if err := Encode(&buf, &want, enc); err != nil {
			t.Fatal(err)
		}
		got, err := Decode(buf.Bytes())
		if err != nil {
			t.Fatalf("encoding %d: %v", enc, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("encoding %d:\n got %+v\nwant %+v", enc, got, want)
		}
	}
}

// Payloads as vLLM and newer releases write them, built field by field: byte hashes, extra
// trailing fields, unknown map keys, unknown event types, a batch without a rank.
func TestDecodeVariants(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hash32 := bytes.Repeat([]byte{7}, 32)
	cases := map[string]struct {
		payload []byte
		check   func(Batch) bool
	}{
		"legacy with lora_name, extra_keys and no rank": {
			enc([]any{1.5, []any{[]any{"BlockStored", []any{hash32}, nil, []int{1, 2}, 2, nil, "GPU", "adapter", []any{"x"}}}}),
			func(b Batch) bool {
				return !b.HasRank && len(b.Events) == 1 && len(b.Events[0].Hashes) == 1 && !b.Events[0].HasParent
			},
		},
		"legacy removed without medium": {
			enc([]any{1.5, []any{[]any{"BlockRemoved", []any{-5, 6}}}, 0}),
			func(b Batch) bool { return b.Events[0].Hashes[0] == uint64(1<<64-5) && b.HasRank },
		},
		"map events with new keys": {
			enc([]any{2.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []int{1}, "parent_block_hash": 9,
				"token_ids": []int{5, 6}, "block_size": 2, "group_idx": 0, "kv_cache_spec_kind": "full", "extra_keys": nil}}}),
			func(b Batch) bool {
				return b.Events[0].HasParent && b.Events[0].Parent == 9 && b.Events[0].Tokens[1] == 6
			},
		},
		"map batch": {
			enc(map[string]any{"ts": 3.0, "events": []any{[]any{"AllBlocksCleared"}}, "data_parallel_rank": 2}),
			func(b Batch) bool { return b.Rank == 2 && b.Events[0].Kind == AllBlocksCleared },
		},
		"unknown event type is skipped": {
			enc([]any{1.0, []any{[]any{"BlockOffloaded", 1, 2}, []any{"AllBlocksCleared"}}}),
			func(b Batch) bool { return len(b.Events) == 1 },
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := Decode(c.payload)
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(b) {
				t.Fatalf("decoded %+v", b)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	enc := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	deep := []any{}
	for range 40 {
		deep = []any{deep}
	}
	cases := map[string][]byte{
		"tokens do not fill the blocks": enc([]any{1.0, []any{[]any{"BlockStored", []int{1, 2}, nil, []int{1, 2, 3}, 2}}}),
		"zero block size":               enc([]any{1.0, []any{[]any{"BlockStored", []int{1}, nil, []int{}, 0}}}),
		"array longer than the payload": {0xdd, 0xff, 0xff, 0xff, 0xf0},
		"nesting in an unknown field":   enc([]any{1.0, []any{}, 0, deep}),
		"trailing bytes":                append(enc([]any{1.0, []any{}}), 0xc0),
		"negative token":                enc([]any{1.0, []any{[]any{"BlockStored", []int{1}, nil, []int{-1}, 1}}}),
		"empty":                         {},
	}
	for name, p := range cases {
		if _, err := Decode(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoding{Legacy, Maps} {
		b := sampleBatch()
		var buf bytes.Buffer
		Encode(&buf, &b, enc)
		f.Add(buf.Bytes())
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	for _, enc := range []Encoding{Legacy, Maps} { // extra_keys and lora_name (salt.go)
		salted := stored([]uint64{1, 2}, 0, false, 4, 1)
		salted.ExtraKeys, salted.LoRAName = []string{"a", "salt"}, "a"
		var buf bytes.Buffer
		Encode(&buf, &Batch{TS: 1, Events: []Event{salted}}, enc)
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind == BlockStored && len(e.Tokens) != len(e.Hashes)*e.BlockSize {
				t.Fatalf("accepted %d tokens for %d blocks of %d", len(e.Tokens), len(e.Hashes), e.BlockSize)
			}
		}
		// Whatever decodes, the index takes without panicking.
		x := NewIndex(16, 4)
		x.Apply(Source{Worker: "w"}, b.Events)
		// Re-encoding what decoded decodes to the same thing.
		var buf bytes.Buffer
		if err := Encode(&buf, &b, Legacy); err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(buf.Bytes()); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
	})
}

// Parent hash 0 means "no parent" (llm-d's publishers write it, its consumer reads it so); an
// event about another KV-cache group or another medium than the GPU is skipped, not failed.
func TestDecodeParentZeroGroupsAndMedia(t *testing.T) {
	enc := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	b, err := Decode(enc([]any{1.0, []any{
		[]any{"BlockStored", []int{5}, 0, []int{1, 2}, 2, nil, "GPU", nil, nil, 0},
		[]any{"BlockStored", []int{6}, nil, []int{1, 2}, 2, nil, "CPU"},
		[]any{"BlockStored", []int{7}, nil, []int{1, 2}, 2, nil, nil, nil, nil, 1},
		map[string]any{"type": "BlockRemoved", "block_hashes": []int{5}, "medium": "GPU", "group_idx": 2},
		map[string]any{"type": "BlockStored", "block_hashes": []int{8}, "parent_block_hash": 0, "token_ids": []int{3, 4},
			"block_size": 2, "lora_id": nil, "medium": nil, "lora_name": nil},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || b.Events[0].HasParent || b.Events[1].HasParent || b.Events[1].Hashes[0] != 8 {
		t.Fatalf("decoded %+v: want the two GPU, group-0 stores, neither with a parent", b.Events)
	}
}

// Counts are bounded by the bytes present, and what they decode to by the limit: a payload of
// one-byte hashes (eight bytes each decoded) or of tiny events (five times their size) fails
// once past it instead of growing the heap.
func TestDecodeBoundsDecodedSize(t *testing.T) {
	hashes := make([]int, 200_000)
	var buf bytes.Buffer
	msgpack.NewEncoder(&buf).Encode([]any{1.0, []any{[]any{"BlockRemoved", hashes}}})
	if _, err := DecodeLimit(buf.Bytes(), 1<<20); err == nil {
		t.Fatal("200,000 one-byte hashes (1.6 MB decoded) passed a 1 MiB bound")
	}
	if _, err := DecodeLimit(buf.Bytes(), 2<<20); err != nil {
		t.Fatalf("within the bound: %v", err)
	}
	events := make([]any, 100_000)
	for i := range events {
		events[i] = []any{"AllBlocksCleared"}
	}
	buf.Reset()
	msgpack.NewEncoder(&buf).Encode([]any{1.0, events})
	if _, err := DecodeLimit(buf.Bytes(), 4<<20); err == nil {
		t.Fatalf("100,000 events (%d bytes on the wire) passed a 4 MiB bound", buf.Len())
	}
}
