// Package zmtp speaks the subset of ZMTP 3.x (the ZeroMQ wire protocol, rfc.zeromq.org 23 and
// 37) that engine KV-cache events need: the NULL security mechanism over TCP, and PUB, SUB,
// ROUTER and DEALER sockets, each able to bind or dial. It interoperates with libzmq peers
// (vLLM and SGLang publish with pyzmq).
//
// Why not a general ZeroMQ library: the gateway reads from publishers it does not control, so
// every length a peer sends is bounded here before anything is allocated (frame size, frames per
// message, handshake metadata), the handshake has a deadline, queues are bounded in both
// directions (a slow peer loses messages, as a ZeroMQ high-water mark does, instead of growing
// memory) and the number of peers a bound socket accepts is capped. The pure-Go library the field
// uses allocates whatever frame size a peer announces.
package zmtp

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame flag bits (ZMTP 3.0 §"Framing").
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// greetingLen is the size of the fixed greeting each side sends first.
const greetingLen = 64

// Errors a peer can cause.
var (
	ErrFrameTooLarge = errors.New("zmtp: frame larger than the limit")
	ErrTooManyFrames = errors.New("zmtp: message has more frames than the limit")
	ErrProtocol      = errors.New("zmtp: protocol error")
)

// greeting returns this side's greeting: signature, version 3.0, mechanism NULL, as-server 0.
// Version 3.0 makes libzmq peers send subscriptions as messages, which every version accepts.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// checkGreeting validates a peer's greeting.
func checkGreeting(g []byte) error {
	if g[0] != 0xff || g[9]&1 != 1 {
		return fmt.Errorf("%w: bad signature", ErrProtocol)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, need 3.x", ErrProtocol, g[10], g[11])
	}
	mech := g[12:32]
	if string(trimZero(mech)) != "NULL" {
		return fmt.Errorf("%w: security mechanism %q is not supported (only NULL)", ErrProtocol, trimZero(mech))
	}
	return nil
}

func trimZero(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// message is one received multipart message or command.
type message struct {
	frames  [][]byte
	command bool
}

// limits bounds what readMessage accepts.
type limits struct {
	maxFrame  int // bytes per frame
	maxFrames int // frames per message
	maxTotal  int // bytes per message
}

// firstChunk is the most a frame body is given before its bytes arrive; it then grows by
// doubling as they do, so a peer that announces a large frame and sends little holds little.
const firstChunk = 64 << 10

// meter accounts for the bytes one connection's reader allocates against a Budget. A reader
// that holds nothing waits for room; one that holds part of a message never waits (two readers
// each holding half the budget and waiting for the other would wait forever): when the budget
// is spent it drops the message instead, reading the rest of it into nothing, as a ZeroMQ
// socket drops at its high-water mark. A nil *meter accounts nothing.
type meter struct {
	ctx    context.Context
	budget *Budget
	held   int // charged for the message being read
}

// errDropped reports a message read to its end and dropped for want of budget.
var errDropped = errors.New("zmtp: message dropped: receive budget spent")

func (mt *meter) take(n int) error {
	if mt == nil || n == 0 {
		return nil
	}
	if mt.held > 0 {
		if !mt.budget.tryAcquire(int64(n)) {
			return errDropped
		}
	} else if err := mt.budget.acquire(mt.ctx, int64(n)); err != nil {
		return err
	}
	mt.held += n
	return nil
}

func (mt *meter) give(n int) {
	if mt != nil && n > 0 {
		mt.held -= n
		mt.budget.release(int64(n))
	}
}

// done hands the message's charge over to it (released by Message.Release).
func (mt *meter) done() {
	if mt != nil {
		mt.held = 0
	}
}

// readMessage reads one message (all its frames) or one command. Nothing is allocated from a
// length a frame header announces: a body grows as its bytes arrive, each allocation charged to
// mt first. held is what the returned message still holds charged (the capacity of its frames),
// for the caller to release when done with it; on error nothing stays charged.
func readMessage(r *bufio.Reader, lim limits, mt *meter) (m message, held int, err error) {
	defer func() {
		if err != nil {
			mt.give(held)
			held = 0
		}
	}()
	total := 0
	for {
		flags, err := r.ReadByte()
		if err != nil {
			return m, held, err
		}
		if flags&^(flagMore|flagLong|flagCommand) != 0 {
			return m, held, fmt.Errorf("%w: reserved frame flags %#x", ErrProtocol, flags)
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return m, held, err
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := r.ReadByte()
			if err != nil {
				return m, held, err
			}
			size = uint64(b)
		}
		if size > uint64(lim.maxFrame) || total+int(size) > lim.maxTotal {
			return m, held, ErrFrameTooLarge
		}
		if len(m.frames) == lim.maxFrames {
			return m, held, ErrTooManyFrames
		}
		body, err := readBody(r, int(size), mt)
		if err == errDropped {
			return m, held, discardRest(r, flags, lim.maxFrames-len(m.frames)-1, lim.maxFrame)
		}
		if err != nil {
			return m, held, err
		}
		held += cap(body)
		total += len(body)
		if flags&flagCommand != 0 {
			// A command is one frame and never has MORE set.
			if len(m.frames) > 0 || flags&flagMore != 0 {
				return m, held, fmt.Errorf("%w: command inside a multipart message", ErrProtocol)
			}
			return message{frames: [][]byte{body}, command: true}, held, nil
		}
		m.frames = append(m.frames, body)
		if flags&flagMore == 0 {
			return m, held, nil
		}
	}
}

// discardRest reads the frames that follow one whose flags were flags, up to frames more of up
// to maxFrame bytes each, into nothing; it returns errDropped once the message is over.
func discardRest(r *bufio.Reader, flags byte, frames, maxFrame int) error {
	for flags&flagMore != 0 {
		if frames == 0 {
			return ErrTooManyFrames
		}
		frames--
		var err error
		if flags, err = r.ReadByte(); err != nil {
			return err
		}
		if flags&^(flagMore|flagLong) != 0 {
			return fmt.Errorf("%w: frame flags %#x inside a message", ErrProtocol, flags)
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return err
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := r.ReadByte()
			if err != nil {
				return err
			}
			size = uint64(b)
		}
		if size > uint64(maxFrame) {
			return ErrFrameTooLarge
		}
		if _, err := r.Discard(int(size)); err != nil {
			return err
		}
	}
	return errDropped
}

// readBody reads a frame body of size bytes into a buffer that grows (doubling) as they arrive,
// each buffer charged to mt before it is allocated and released when outgrown; the returned
// body's capacity stays charged. On error nothing stays charged.
func readBody(r *bufio.Reader, size int, mt *meter) ([]byte, error) {
	var body []byte
	grow := func(n int) error {
		if err := mt.take(n); err != nil {
			return err
		}
		old := cap(body)
		body = append(make([]byte, 0, n), body...)
		mt.give(old)
		return nil
	}
	if err := grow(min(size, firstChunk)); err != nil {
		if err == errDropped {
			_, err = r.Discard(size)
			err = cmp.Or(err, errDropped)
		}
		return nil, err
	}
	for len(body) < size {
		if len(body) == cap(body) {
			if err := grow(min(size, 2*cap(body))); err != nil {
				mt.give(cap(body))
				if err == errDropped {
					_, err = r.Discard(size - len(body))
					err = cmp.Or(err, errDropped)
				}
				return nil, err
			}
		}
		k, err := io.ReadFull(r, body[len(body):cap(body)])
		body = body[:len(body)+k]
		if err != nil {
			mt.give(cap(body))
			return nil, err
		}
	}
	return body, nil
}

// writeFrame writes one frame.
func writeFrame(w *bufio.Writer, body []byte, flags byte) error {
	if len(body) > 255 {
		flags |= flagLong
	}
	if err := w.WriteByte(flags); err != nil {
		return err
	}
	if flags&flagLong != 0 {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(len(body)))
		w.Write(b[:])
	} else {
		w.WriteByte(byte(len(body)))
	}
	_, err := w.Write(body)
	return err
}

// writeMessage writes a multipart message (without flushing).
func writeMessage(w *bufio.Writer, frames [][]byte) error {
	if len(frames) == 0 {
		frames = [][]byte{nil}
	}
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if err := writeFrame(w, f, flags); err != nil {
			return err
		}
	}
	return nil
}

// command builds a command body: name length, name, data.
func command(name string, data []byte) []byte {
	b := make([]byte, 0, 1+len(name)+len(data))
	b = append(b, byte(len(name)))
	b = append(b, name...)
	return append(b, data...)
}

// parseCommand splits a command body into its name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) < 1 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: short command", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// readyData encodes READY metadata: Socket-Type, and Identity when set.
func readyData(socketType string, identity []byte) []byte {
	var b []byte
	prop := func(name string, value []byte) {
		b = append(b, byte(len(name)))
		b = append(b, name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
		b = append(b, value...)
	}
	prop("Socket-Type", []byte(socketType))
	if len(identity) > 0 {
		prop("Identity", identity)
	}
	return b
}

// parseReady decodes READY metadata into its properties (names compared case-insensitively by
// the caller). Every length is checked against what is left.
func parseReady(data []byte) (map[string][]byte, error) {
	props := map[string][]byte{}
	for len(data) > 0 {
		n := int(data[0])
		if 1+n+4 > len(data) {
			return nil, fmt.Errorf("%w: truncated READY property", ErrProtocol)
		}
		name := string(data[1 : 1+n])
		vl := binary.BigEndian.Uint32(data[1+n : 5+n])
		data = data[5+n:]
		if uint64(vl) > uint64(len(data)) {
			return nil, fmt.Errorf("%w: truncated READY value", ErrProtocol)
		}
		if len(props) < 32 {
			props[name] = data[:vl]
		}
		data = data[vl:]
	}
	return props, nil
}
