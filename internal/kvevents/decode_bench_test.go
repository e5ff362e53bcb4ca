package kvevents_test

import (
	"bytes"
	"testing"

	"github.com/kvgate/kvgate/internal/kvevents"
)

// BenchmarkDecode decodes one engine step's batch as vLLM publishes it: 32 requests each storing
// 16 blocks of 16 tokens (token ids spread over a 128k vocabulary, 64-bit hashes) and a removal
// of 64 blocks, in the legacy array encoding and in the map encoding.
func BenchmarkDecode(b *testing.B) {
	var evs []kvevents.Event
	for r := range 32 {
		e := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, Parent: uint64(r) << 40, HasParent: r%2 == 1}
		for k := range 16 {
			e.Hashes = append(e.Hashes, uint64(r)<<48|uint64(k)*0x9e3779b97f4a7c15>>16)
			for j := range 16 {
				e.Tokens = append(e.Tokens, uint32((r*7919+k*104729+j*31)%128000))
			}
		}
		evs = append(evs, e)
	}
	rm := kvevents.Event{Kind: kvevents.BlockRemoved}
	for k := range 64 {
		rm.Hashes = append(rm.Hashes, uint64(k)*0x9e3779b97f4a7c15)
	}
	evs = append(evs, rm)
	batch := kvevents.Batch{TS: 1733000000.5, Events: evs, HasRank: true}
	for _, enc := range []struct {
		name string
		e    kvevents.Encoding
	}{{"legacy", kvevents.Legacy}, {"maps", kvevents.Maps}} {
		var buf bytes.Buffer
		if err := kvevents.Encode(&buf, &batch, enc.e); err != nil {
			b.Fatal(err)
		}
		b.Run(enc.name, func(b *testing.B) {
			b.SetBytes(int64(buf.Len()))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := kvevents.Decode(buf.Bytes()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
