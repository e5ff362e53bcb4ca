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
