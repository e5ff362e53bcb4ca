// Package kvevents gives the gateway the engines' own picture of their KV caches (DESIGN.md §8).
// Engines (vLLM, SGLang, kvgate sim) publish KV-cache events over ZeroMQ: a block stored, with
// its hash, its parent's hash and its token ids; blocks removed; everything cleared. The Service
// subscribes to every worker — the gateway binds a SUB socket engines dial, or dials each
// worker's PUB socket, or both — maps each topic to a registered worker, checks each stream's
// sequence numbers (a gap asks the publisher's replay socket for the missing batches and, when
// that fails, drops the worker's picture until fresh events rebuild it), and keeps an Index:
// per stream, which blocks it holds, keyed by the token ids chained from the start of the
// prompt, so that a request tokenized the same way (Tokenizer, by a worker's /tokenize) finds
// the longest prefix each worker really holds. Several gateway replicas each subscribe to every
// engine and so share one picture with no protocol between them.
//
// The Publisher is the engine side, used by the engine simulator.
//
// Everything a publisher sends is bounded before it is believed: frame sizes and counts (package
// zmtp), msgpack lengths against the bytes present, nesting depth, blocks per stream, streams
// per worker; a topic naming no registered worker is dropped.
package kvevents
