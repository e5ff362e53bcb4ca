package kvevents

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how Encode writes events.
type Encoding uint8

const (
	// Legacy writes every struct as an array tagged by its type name (vLLM's msgspec
	// array_like encoding).
	Legacy Encoding = iota
	// Maps writes each event as a map with a "type" key (newer vLLM releases).
	Maps
)

// Encode appends the msgpack encoding of b to dst. The engine simulator publishes with it; tests
// use both encodings.
func Encode(dst *bytes.Buffer, b *Batch, enc Encoding) error {
	e := msgpack.NewEncoder(dst)
	e.EncodeArrayLen(3)
	e.EncodeFloat64(b.TS)
	e.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		encodeEvent(e, &b.Events[i], enc)
	}
	if b.HasRank {
		return e.EncodeInt(int64(b.Rank))
	}
	return e.EncodeNil()
}

func encodeEvent(e *msgpack.Encoder, ev *Event, enc Encoding) {
	var name string
	switch ev.Kind {
	case BlockStored:
		name = "BlockStored"
	case BlockRemoved:
		name = "BlockRemoved"
	default:
		name = "AllBlocksCleared"
	}
	key := func(k string) {
		if enc == Maps {
			e.EncodeString(k)
		}
	}
	hashes := func() {
		key("block_hashes")
		e.EncodeArrayLen(len(ev.Hashes))
		for _, h := range ev.Hashes {
			e.EncodeUint64(h)
		}
	}
	fields := map[Kind]int{BlockStored: 7, BlockRemoved: 3, AllBlocksCleared: 1}[ev.Kind]
	extra := ev.Kind == BlockStored && (len(ev.ExtraKeys) > 0 || ev.LoRAName != "")
	if extra {
		fields += 2 // lora_name, extra_keys
	}
	if enc == Maps {
		e.EncodeMapLen(fields)
		e.EncodeString("type")
	} else {
		e.EncodeArrayLen(fields)
	}
	e.EncodeString(name)
	switch ev.Kind {
	case BlockStored:
		hashes()
		key("parent_block_hash")
		if ev.HasParent {
			e.EncodeUint64(ev.Parent)
		} else {
			e.EncodeNil()
		}
		key("token_ids")
		e.EncodeArrayLen(len(ev.Tokens))
		for _, t := range ev.Tokens {
			e.EncodeUint32(t)
		}
		key("block_size")
		e.EncodeInt(int64(ev.BlockSize))
		key("lora_id")
		if ev.HasLoRA {
			e.EncodeInt(ev.LoRA)
		} else {
			e.EncodeNil()
		}
		key("medium")
		e.EncodeString("GPU")
		if extra {
			encodeExtra(e, ev, key)
		}
	case BlockRemoved:
		hashes()
		key("medium")
		e.EncodeString("GPU")
	}
}

// encodeExtra writes a BlockStored's lora_name and extra_keys (its first block's ExtraKeys, nil
// for the others), as newer vLLM does.
func encodeExtra(e *msgpack.Encoder, ev *Event, key func(string)) {
	key("lora_name")
	if ev.LoRAName != "" {
		e.EncodeString(ev.LoRAName)
	} else {
		e.EncodeNil()
	}
	key("extra_keys")
	e.EncodeArrayLen(len(ev.Hashes))
	for i := range ev.Hashes {
		if i > 0 || len(ev.ExtraKeys) == 0 {
			e.EncodeNil()
			continue
		}
		e.EncodeArrayLen(len(ev.ExtraKeys))
		for _, k := range ev.ExtraKeys {
			e.EncodeString(k)
		}
	}
}
