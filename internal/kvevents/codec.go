package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind says what an Event reports. The zero value is not a valid kind.
type Kind uint8

// The event kinds vLLM and SGLang publish.
const (
	// BlockStored: blocks entered the engine's prefix cache.
	BlockStored Kind = iota + 1
	// BlockRemoved: blocks left it.
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared
)

// Event is one KV-cache event. Fields a kind does not use are zero.
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes, in chain order for BlockStored. A hash sent as bytes
	// (newer vLLM) is folded to 64 bits.
	Hashes []uint64
	// Parent is the hash of the block before the first stored one; HasParent is false for a
	// chain that starts at the beginning of a prompt (sent as nil, or as 0 the way some
	// vLLM-compatible publishers write "no parent").
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// LoRA is the adapter id of the stored blocks; HasLoRA is false for the base model.
	LoRA    int64
	HasLoRA bool
	// LoRAName is the adapter's name ("lora_name"), "" when the event gives none.
	LoRAName string
	// ExtraKeys are the string extra keys of the first stored block ("extra_keys": a cache
	// salt, multimodal identifiers, the adapter's name); Encode writes them, Decode reads them.
	ExtraKeys []string
	// Salt mixes ExtraKeys but the adapter's name (salt.go), when Salted; only a BlockStored
	// that starts a chain has one.
	Salt   uint64
	Salted bool
}

// Batch is one KVEventBatch: a timestamp (seconds since the epoch), events in order, and the
// data-parallel rank of the publishing engine (HasRank false when absent).
type Batch struct {
	TS      float64
	Events  []Event
	Rank    int
	HasRank bool
}

// Limits on what Decode accepts, whatever the payload claims.
const (
	maxNesting = 16
	// maxTokenID bounds a token id (vocabularies are well under 2^31).
	maxTokenID = 1<<32 - 1
	// DefaultMaxDecoded is Decode's bound on the memory a batch decodes to, in bytes: a msgpack
	// integer takes one byte on the wire and eight as a decoded hash, so counts checked against
	// the bytes present still let a payload grow eightfold (an event, tenfold more).
	DefaultMaxDecoded = 16 << 20
)

// eventSize is what one decoded Event costs besides its arrays; minEventBytes is the least an
// event that is kept takes on the wire (["BlockRemoved"]).
const (
	eventSize     = int(unsafe.Sizeof(Event{}))
	minEventBytes = 14
)

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("kvevents: malformed event batch")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// decoder reads one payload; every declared length is checked against the bytes left before
// anything is allocated for it (each element takes at least one byte), and every allocation is
// charged to left, the decoded bytes still allowed.
type decoder struct {
	r    *bytes.Reader
	d    *msgpack.Decoder
	left int
}

// charge takes n decoded bytes from what the batch may still decode to.
func (d *decoder) charge(n int) error {
	if n > d.left {
		return malformed("decodes to more than its bound of memory")
	}
	d.left -= n
	return nil
}

// Decode parses one msgpack KVEventBatch payload, in the legacy encoding (structs as arrays
// tagged by type name) or the newer one (events as maps with a "type" key); fields it does not
// use, and fields it does not know, are skipped. An event of an unknown type is skipped too, and
// so is one about another cache than the one routing reads: a KV-cache group other than the
// first (group_idx > 0, hybrid models), or a medium other than the GPU (offloaded copies). The
// batch decodes to at most DefaultMaxDecoded bytes.
func Decode(payload []byte) (Batch, error) { return DecodeLimit(payload, DefaultMaxDecoded) }

// DecodeLimit is Decode with a bound of maxDecoded bytes on what the batch decodes to.
func DecodeLimit(payload []byte, maxDecoded int) (Batch, error) {
	r := bytes.NewReader(payload)
	dec := &decoder{r: r, d: msgpack.NewDecoder(r), left: maxDecoded}
	b, err := dec.batch()
	if err != nil {
		return Batch{}, err
	}
	if r.Len() != 0 {
		return Batch{}, malformed("%d trailing bytes", r.Len())
	}
	return b, nil
}

func (d *decoder) peek() (byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, malformed("truncated")
	}
	return c, nil
}

func isMap(c byte) bool { return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 }

func (d *decoder) arrayLen() (int, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, malformed("array: %v", err)
	}
	n = max(n, 0) // nil decodes as -1: an absent array
	if n > d.r.Len() {
		return 0, malformed("array of %d elements in %d bytes", n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) mapLen() (int, error) {
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return 0, malformed("map: %v", err)
	}
	n = max(n, 0) // nil decodes as -1: an absent map
	if n > d.r.Len()/2 {
		return 0, malformed("map of %d entries in %d bytes", n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) str() (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", malformed("expected a string")
	}
	s, err := d.d.DecodeString()
	if err != nil {
		return "", malformed("string: %v", err)
	}
	return s, d.charge(len(s))
}

// skip skips one value of any type, refusing nesting deeper than maxNesting.
func (d *decoder) skip(depth int) error {
	if depth > maxNesting {
		return malformed("nested deeper than %d", maxNesting)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.d.Skip(); err != nil {
		return malformed("skip: %v", err)
	}
	return nil
}

// isNil consumes a nil and reports true, or reports false consuming nothing.
func (d *decoder) isNil() (bool, error) {
	c, err := d.peek()
	if err != nil {
		return false, err
	}
	if c != msgpcode.Nil {
		return false, nil
	}
	d.d.DecodeNil()
	return true, nil
}

// int64v reads an integer (a float with an integral value is accepted too).
func (d *decoder) int64v() (int64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Uint64 {
		u, err := d.d.DecodeUint64()
		if err != nil {
			return 0, malformed("integer: %v", err)
		}
		return int64(u), nil
	}
	v, err := d.d.DecodeInt64()
	if err != nil {
		return 0, malformed("integer: %v", err)
	}
	return v, nil
}

// hash reads a block hash: an integer, or bytes folded to 64 bits with FNV-1a.
func (d *decoder) hash() (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := d.d.DecodeBytes()
		if err != nil {
			return 0, malformed("hash: %v", err)
		}
		if err := d.charge(len(b)); err != nil {
			return 0, err
		}
		h := uint64(14695981039346656037)
		for _, x := range b {
			h = (h ^ uint64(x)) * 1099511628211
		}
		return h, nil
	}
	v, err := d.int64v()
	return uint64(v), err
}

func (d *decoder) hashes() ([]uint64, error) {
	if null, err := d.isNil(); null || err != nil {
		return nil, err
	}
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if err := d.charge(8 * n); err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *decoder) tokens() ([]uint32, error) {
	if null, err := d.isNil(); null || err != nil {
		return nil, err
	}
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if err := d.charge(4 * n); err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	for i := range out {
		v, err := d.int64v()
		if err != nil {
			return nil, err
		}
		if v < 0 || v > maxTokenID {
			return nil, malformed("token id %d out of range", v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// parent reads a parent block hash: nil, or the integer 0 (which llm-d's publishers write, and
// its consumer reads, as "no parent"), starts a chain at the beginning of a prompt.
func (d *decoder) parent(e *Event) error {
	if null, err := d.isNil(); null || err != nil {
		return err
	}
	h, err := d.hash()
	e.Parent, e.HasParent = h, err == nil && h != 0
	return err
}

func (d *decoder) optInt(v *int64, has *bool) error {
	if null, err := d.isNil(); null || err != nil {
		return err
	}
	x, err := d.int64v()
	*v, *has = x, err == nil
	return err
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	c, err := d.peek()
	if err != nil {
		return b, err
	}
	var rank int64
	if isMap(c) {
		n, err := d.mapLen()
		if err != nil {
			return b, err
		}
		for range n {
			k, err := d.str()
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				b.TS, err = d.float()
			case "events":
				b.Events, err = d.events()
			case "data_parallel_rank":
				err = d.optInt(&rank, &b.HasRank)
			default:
				err = d.skip(1)
			}
			if err != nil {
				return b, err
			}
		}
	} else {
		n, err := d.arrayLen()
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, malformed("batch of %d fields", n)
		}
		if b.TS, err = d.float(); err != nil {
			return b, err
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		if n >= 3 {
			if err := d.optInt(&rank, &b.HasRank); err != nil {
				return b, err
			}
		}
		for range n - 3 {
			if err := d.skip(1); err != nil {
				return b, err
			}
		}
	}
	if b.HasRank {
		if rank < 0 || rank > 1<<16 {
			return b, malformed("data-parallel rank %d out of range", rank)
		}
		b.Rank = int(rank)
	}
	return b, nil
}

func (d *decoder) float() (float64, error) {
	if null, err := d.isNil(); null || err != nil {
		return 0, err
	}
	v, err := d.d.DecodeFloat64()
	if err != nil {
		return 0, malformed("timestamp: %v", err)
	}
	return v, nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	// Sized from what the bytes can hold, not from n: an event that is kept takes at least
	// minEventBytes on the wire (one that is skipped, two), and is charged before it is made.
	var out []Event
	if c := min(n, d.r.Len()/minEventBytes); c > 0 {
		if err := d.charge(c * eventSize); err != nil {
			return nil, err
		}
		out = make([]Event, 0, c)
	}
	for range n {
		e, err := d.event()
		if err != nil {
			return nil, err
		}
		if e.Kind != 0 {
			if len(out) == cap(out) {
				// Charged by capacity, so that the slack of growing counts too.
				more := min(max(8, cap(out)), n-len(out))
				if err := d.charge(more * eventSize); err != nil {
					return nil, err
				}
				out = slices.Grow(out, more)
			}
			out = append(out, e)
		}
	}
	return out, nil
}

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// event reads one event; an unknown type gives Kind 0 (skipped by the caller).
func (d *decoder) event() (Event, error) {
	var e Event
	c, err := d.peek()
	if err != nil {
		return e, err
	}
	var bs, group int64
	var hasBS, hasGroup bool
	var offGPU bool // the medium names another than the GPU
	// value reads the value of the named field, the same in both encodings; a field this
	// decoder does not use is skipped.
	value := func(name string) (err error) {
		switch name {
		case "block_hashes":
			e.Hashes, err = d.hashes()
		case "parent_block_hash":
			err = d.parent(&e)
		case "token_ids":
			e.Tokens, err = d.tokens()
		case "block_size":
			err = d.optInt(&bs, &hasBS)
		case "lora_id":
			err = d.optInt(&e.LoRA, &e.HasLoRA)
		case "lora_name":
			e.LoRAName, err = d.optStr()
		case "extra_keys":
			e.ExtraKeys, err = d.extraKeys()
		case "medium":
			offGPU, err = d.offGPU()
		case "group_idx":
			err = d.optInt(&group, &hasGroup)
		default:
			err = d.skip(1)
		}
		return err
	}
	if isMap(c) {
		n, err := d.mapLen()
		if err != nil {
			return e, err
		}
		for range n {
			k, err := d.str()
			if err != nil {
				return e, err
			}
			if k == "type" {
				var tag string
				tag, err = d.str()
				e.Kind = kindOf(tag)
			} else {
				err = value(k)
			}
			if err != nil {
				return e, err
			}
		}
	} else {
		n, err := d.arrayLen()
		if err != nil {
			return e, err
		}
		if n < 1 {
			return e, malformed("empty event")
		}
		tag, err := d.str()
		if err != nil {
			return e, err
		}
		e.Kind = kindOf(tag)
		// Field order per type, as vLLM declares them; trailing fields may be absent, extra
		// ones follow.
		for i := 1; i < n; i++ {
			if err := value(field(e.Kind, i)); err != nil {
				return e, err
			}
		}
	}
	if e.Kind == BlockStored {
		if !hasBS || bs < 1 || bs > 1<<16 {
			return e, malformed("block size %d out of range", bs)
		}
		e.BlockSize = int(bs)
		e.saltOf()
		if len(e.Tokens) != len(e.Hashes)*e.BlockSize {
			return e, malformed("%d token ids for %d blocks of %d", len(e.Tokens), len(e.Hashes), bs)
		}
	}
	if offGPU || hasGroup && group != 0 {
		// Another cache than the one a request's prefill reads first: an offloaded copy, or
		// another KV-cache group of a hybrid model (whose blocks and evictions differ).
		return Event{}, nil
	}
	return e, nil
}

// storedFields and removedFields name the fields of the array encoding after the type tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// field names the i-th element (1: the first after the tag) of an array-encoded event of kind
// k, "" for one it does not use.
func field(k Kind, i int) string {
	var f []string
	switch k {
	case BlockStored:
		f = storedFields
	case BlockRemoved:
		f = removedFields
	}
	if i-1 < len(f) {
		return f[i-1]
	}
	return ""
}

// offGPU reads a medium (a string or nil) and reports whether it names another than the GPU;
// "GPU", the common case, is compared without allocating a string.
func (d *decoder) offGPU() (bool, error) {
	if null, err := d.isNil(); null || err != nil {
		return false, err
	}
	if c, _ := d.peek(); c == msgpcode.FixedStrLow|3 && d.r.Len() >= 4 {
		var b [4]byte
		d.r.Read(b[:]) // the decoder reads d.r directly: a bytes.Reader needs no buffer
		return string(b[1:]) != "GPU", nil
	}
	m, err := d.str()
	return m != "" && m != "GPU", err
}
