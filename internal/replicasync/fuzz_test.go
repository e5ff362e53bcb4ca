package replicasync

import (
	"testing"
	"time"
)

// FuzzApply feeds arbitrary batches to a Node: it must never panic, apply a batch only when
// every record decodes, and keep its tables within bounds.
func FuzzApply(f *testing.F) {
	seed := AppendHeader(nil, Header{Sender: 7, Seq: 1})
	seed = AppendDecision(seed, "m", "w", 1, 10, []uint64{1, 2, 3})
	seed = AppendFinish(seed, "m", "w", 1)
	seed = AppendAffinity(seed, NSResponse, 9, "m", "w")
	f.Add(seed)
	f.Add([]byte{Version})
	f.Add(AppendHeader(nil, Header{Sender: 1, Seq: 0}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		c := &clock{t: time.Unix(1000, 0)}
		n, err := NewNode(Config{Now: c.now, MaxWorkers: 4, MaxPlacements: 16, MaxAffinity: 4})
		if err != nil {
			t.Fatal(err)
		}
		err = n.Apply(msg)
		rd, _, herr := NewReader(msg)
		valid := herr == nil
		for valid {
			var r Record
			ok, err := rd.Next(&r)
			if err != nil {
				valid = false
			}
			if !ok {
				break
			}
		}
		if valid != (err == nil) && err != ErrSelf {
			t.Fatalf("Apply = %v for a batch whose decoding says valid=%v", err, valid)
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if len(n.logs) > 4 {
			t.Fatalf("%d workers tracked", len(n.logs))
		}
		for _, pl := range n.models {
			if len(pl.fifo) > 16 {
				t.Fatalf("%d placements", len(pl.fifo))
			}
		}
	})
}
