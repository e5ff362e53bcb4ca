package replicasync

import (
	"encoding/binary"
	"errors"
)

// The wire format of one batch (version 1), every integer little-endian:
//
//	batch    = version:u8 sender:u64 seq:u64 record*
//	decision = 1:u8 model worker reqid:u64 uncached:uvarint n:u8 hash:u64×n
//	finish   = 2:u8 model worker reqid:u64
//	affinity = 3:u8 ns:u8 key:u64 model worker
//	model, worker = len:u8 bytes
//
// sender is the publishing replica's random id (new at every start), seq its batch counter
// (1, 2, …): a receiver applies each batch once and in order. A batch with no record is a
// heartbeat. A decision's hashes are the chained chunk hashes of its routing text at the
// positions of Chainer.Sampled; a receiver learns the prefix's length from where its own chain
// meets them, so positions are not sent. Nothing carries a time: ages are measured at receipt.

// Version is the first byte of every batch; a receiver drops any other.
const Version = 1

// Record kinds.
const (
	KindDecision Kind = 1
	KindFinish   Kind = 2
	KindAffinity Kind = 3
)

// Affinity namespaces.
const (
	// NSResponse binds a Responses API response id to the worker that holds it.
	NSResponse byte = 1
	// NSSession binds a sticky-session key to its worker.
	NSSession byte = 2
)

// Bounds of the format: a record past one is malformed.
const (
	// MaxNameBytes bounds a model name or a worker id, in bytes.
	MaxNameBytes = 128
	// MaxHashes bounds the chunk hashes of one decision.
	MaxHashes = 14
	// MaxBatchBytes bounds one batch, in bytes; a publisher flushes before it.
	MaxBatchBytes = 32 << 10
	// MaxRecordBytes is the largest encoded record.
	MaxRecordBytes = 1 + 2*(1+MaxNameBytes) + 8 + binary.MaxVarintLen64 + 1 + 8*MaxHashes
	// MaxUncached bounds the uncached tokens of one decision; a larger value is malformed.
	MaxUncached = 1 << 24
	headerBytes = 1 + 8 + 8
)

// Kind is a record's kind.
type Kind uint8

// Header is a batch's header.
type Header struct {
	// Sender is the publishing replica's id; Seq its batch counter, from 1.
	Sender, Seq uint64
}

// Record is one decoded record. Model and Worker, and the hashes, are views into the batch:
// valid until the batch's buffer is reused.
type Record struct {
	Kind          Kind
	Model, Worker []byte
	// ReqID is the decision's or finish's request id hash (0: none).
	ReqID uint64
	// Uncached is a decision's uncached tokens sent.
	Uncached uint64
	// NS and Key are an affinity record's namespace and keyed key hash.
	NS  byte
	Key uint64
	// hashes holds a decision's chunk hashes, 8 bytes each (Hash).
	hashes []byte
}

// Hashes returns the number of chunk hashes of a decision.
func (r *Record) Hashes() int { return len(r.hashes) / 8 }

// Hash returns a decision's i-th chunk hash.
func (r *Record) Hash(i int) uint64 { return binary.LittleEndian.Uint64(r.hashes[8*i:]) }

// Errors of Decode.
var (
	ErrVersion   = errors.New("replicasync: unknown batch version")
	ErrMalformed = errors.New("replicasync: malformed batch")
)

// AppendHeader starts a batch in b.
func AppendHeader(b []byte, h Header) []byte {
	b = append(b, Version)
	b = binary.LittleEndian.AppendUint64(b, h.Sender)
	return binary.LittleEndian.AppendUint64(b, h.Seq)
}

func appendName(b []byte, s string) []byte {
	if len(s) > MaxNameBytes {
		s = s[:MaxNameBytes]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// AppendDecision appends a decision record; names past MaxNameBytes are cut, hashes past
// MaxHashes dropped, uncached clamped to MaxUncached.
func AppendDecision(b []byte, model, worker string, reqID, uncached uint64, hashes []uint64) []byte {
	b = append(b, byte(KindDecision))
	b = appendName(b, model)
	b = appendName(b, worker)
	b = binary.LittleEndian.AppendUint64(b, reqID)
	b = binary.AppendUvarint(b, min(uncached, MaxUncached))
	hashes = hashes[:min(len(hashes), MaxHashes)]
	b = append(b, byte(len(hashes)))
	for _, h := range hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// AppendFinish appends a finish record.
func AppendFinish(b []byte, model, worker string, reqID uint64) []byte {
	b = append(b, byte(KindFinish))
	b = appendName(b, model)
	b = appendName(b, worker)
	return binary.LittleEndian.AppendUint64(b, reqID)
}

// AppendAffinity appends an affinity record.
func AppendAffinity(b []byte, ns byte, key uint64, model, worker string) []byte {
	b = append(b, byte(KindAffinity), ns)
	b = binary.LittleEndian.AppendUint64(b, key)
	b = appendName(b, model)
	return appendName(b, worker)
}

// Reader decodes one batch record by record, allocating nothing.
type Reader struct {
	buf []byte
	off int
}

// NewReader checks msg's version and header and returns a Reader over its records.
func NewReader(msg []byte) (Reader, Header, error) {
	if len(msg) < headerBytes || len(msg) > MaxBatchBytes {
		return Reader{}, Header{}, ErrMalformed
	}
	if msg[0] != Version {
		return Reader{}, Header{}, ErrVersion
	}
	h := Header{Sender: binary.LittleEndian.Uint64(msg[1:]), Seq: binary.LittleEndian.Uint64(msg[9:])}
	if h.Seq == 0 {
		return Reader{}, Header{}, ErrMalformed
	}
	return Reader{buf: msg, off: headerBytes}, h, nil
}

// Next decodes the next record into r: false at the end, an error for a malformed record.
func (rd *Reader) Next(r *Record) (bool, error) {
	if rd.off >= len(rd.buf) {
		return false, nil
	}
	*r = Record{Kind: Kind(rd.buf[rd.off])}
	rd.off++
	var ok bool
	switch r.Kind {
	case KindDecision:
		ok = rd.name(&r.Model) && rd.name(&r.Worker) && rd.u64(&r.ReqID) && rd.uvarint(&r.Uncached) &&
			r.Uncached <= MaxUncached && rd.hashes(&r.hashes)
	case KindFinish:
		ok = rd.name(&r.Model) && rd.name(&r.Worker) && rd.u64(&r.ReqID)
	case KindAffinity:
		ok = rd.byte(&r.NS) && (r.NS == NSResponse || r.NS == NSSession) && rd.u64(&r.Key) &&
			rd.name(&r.Model) && rd.name(&r.Worker)
	}
	if !ok || len(r.Worker) == 0 {
		rd.off = len(rd.buf)
		return false, ErrMalformed
	}
	return true, nil
}

func (rd *Reader) byte(v *byte) bool {
	if rd.off >= len(rd.buf) {
		return false
	}
	*v = rd.buf[rd.off]
	rd.off++
	return true
}

func (rd *Reader) name(v *[]byte) bool {
	var n byte
	if !rd.byte(&n) || int(n) > MaxNameBytes || len(rd.buf)-rd.off < int(n) {
		return false
	}
	*v = rd.buf[rd.off : rd.off+int(n) : rd.off+int(n)]
	rd.off += int(n)
	return true
}

func (rd *Reader) u64(v *uint64) bool {
	if len(rd.buf)-rd.off < 8 {
		return false
	}
	*v = binary.LittleEndian.Uint64(rd.buf[rd.off:])
	rd.off += 8
	return true
}

func (rd *Reader) uvarint(v *uint64) bool {
	x, n := binary.Uvarint(rd.buf[rd.off:])
	if n <= 0 {
		return false
	}
	*v = x
	rd.off += n
	return true
}

func (rd *Reader) hashes(v *[]byte) bool {
	var n byte
	if !rd.byte(&n) || int(n) > MaxHashes || len(rd.buf)-rd.off < 8*int(n) {
		return false
	}
	*v = rd.buf[rd.off : rd.off+8*int(n) : rd.off+8*int(n)]
	rd.off += 8 * int(n)
	return true
}
