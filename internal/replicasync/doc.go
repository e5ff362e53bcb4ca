// Package replicasync shares every routing decision between gateway replicas, so that replicas
// behind one Service route as one fleet.
//
// Each replica publishes, per decision, the model, the worker, the placed prefix as keyed hashes
// of its chunks (never prompt text), the uncached tokens it sent and the request's id; per
// answer, a finish; per conversation, the response id or session key bound to a worker. Each
// replica applies its peers' records to
//
//   - a peer-placement view (Placement) that the cost consults for Ĉ beside its own prefix tree;
//   - S, the uncached tokens sent to each worker since its engine's last report, which becomes
//     the sum of what every replica sent (Peers.SentSince) instead of this replica's share times
//     an estimated replica count;
//   - an affinity table (response id / session key → worker) that a follow-up reaching any
//     replica consults.
//
// The Node is the protocol, with no goroutine and an injected clock, so the virtual-time fleet
// simulator runs the same code over a modelled bus. Plane runs a Node over a Bus (NATS, bus.go)
// in real time: it batches records, publishes them, applies what it receives, and fails open
// (no bus, no peers heard: every replica routes as without sync).
//
// The wire format (wire.go) is versioned, compact and bounded; everything a peer sends is
// untrusted: sizes are checked before use, every table is bounded, a peer over its rate or
// bytes is dropped for the moment, one that sends garbage is dropped and counted.
package replicasync
