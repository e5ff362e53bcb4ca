// Package kvevents gives the gateway the engines' own picture of their KV caches.
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
// Publishers are not trusted. A bound socket listens on loopback unless given an allow-list of
// sources; a publisher may speak only for workers on its own host (or those a worker's
// kv_events_publisher label names); a stream that restarts, jumps, or sends garbage is
// resynchronized, never frozen. Everything a publisher sends is bounded before it is believed:
// frames grow as their bytes arrive, within a byte budget shared by every connection and the
// receive queue (package zmtp); connections still handshaking are few and short-lived; msgpack
// lengths are checked against the bytes present and what a batch decodes to against a bound;
// blocks per worker and streams per worker are capped; a topic naming no registered worker is
// dropped. A publisher's connection that ends keeps its picture for Config.Resync, for the
// engine to come back; one that does not is forgotten.
package kvevents
