package replicasync

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchBatches returns batches of one decision and one finish each, over 8 workers, with
// routing texts of textBytes.
func benchBatches(b *testing.B, c *clock, textBytes int) [][]byte {
	a := newTestNode(b, c, Config{})
	text := strings.Repeat("x", textBytes)
	var msgs [][]byte
	for i := range 1024 {
		w := "worker-" + strconv.Itoa(i%8)
		a.Decided("meta-llama/Llama-3.1-8B-Instruct", w, text[:textBytes-i%64], "req-"+strconv.Itoa(i), 1500)
		a.Finished("meta-llama/Llama-3.1-8B-Instruct", w, "req-"+strconv.Itoa(i))
		_ = a.Flush(func(m []byte) error { msgs = append(msgs, append([]byte(nil), m...)); return nil })
	}
	return msgs
}

// BenchmarkApply is the cost of applying one peer batch of a decision (8 KiB routing text) and a
// finish: what each replica pays per peer decision.
func BenchmarkApply(b *testing.B) {
	c := &clock{t: time.Unix(1000, 0)}
	msgs := benchBatches(b, c, 8192)
	n := newTestNode(b, c, Config{PeerRecords: 1e12, PeerBytes: 1e15})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// Replay with fresh sequence numbers: patch the header's seq.
		m := msgs[i%len(msgs)]
		seq := uint64(i + 1)
		for k := range 8 {
			m[9+k] = byte(seq >> (8 * k))
		}
		c.t = c.t.Add(time.Microsecond)
		if err := n.Apply(m); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkDecided is the cost of recording and encoding one decision (8 KiB routing text) and
// publishing its batch: what a replica pays per own decision.
func BenchmarkDecided(b *testing.B) {
	c := &clock{t: time.Unix(1000, 0)}
	n := newTestNode(b, c, Config{})
	text := strings.Repeat("x", 8192)
	b.ReportAllocs()
	for b.Loop() {
		n.Decided("meta-llama/Llama-3.1-8B-Instruct", "worker-1", text, "req-1", 1500)
		_ = n.Flush(func([]byte) error { return nil })
	}
}

// BenchmarkPlaced is the cost of the peer-placement lookup of one decision over 8 candidates.
func BenchmarkPlaced(b *testing.B) {
	c := &clock{t: time.Unix(1000, 0)}
	msgs := benchBatches(b, c, 8192)
	n := newTestNode(b, c, Config{PeerRecords: 1e12, PeerBytes: 1e15})
	for _, m := range msgs {
		_ = n.Apply(m)
	}
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = "worker-" + strconv.Itoa(i)
	}
	out := make([]int, 8)
	text := strings.Repeat("x", 8192-5) + "tail!"
	b.ReportAllocs()
	for b.Loop() {
		n.Placed("meta-llama/Llama-3.1-8B-Instruct", text, ids, out)
	}
}
