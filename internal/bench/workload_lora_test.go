package bench

import "testing"

// Adapter sessions follow a Zipf popularity, deterministically, and every turn names its
// session's adapter; a trace stays a Replay.
func TestWithAdapters(t *testing.T) {
	w, err := WithAdapters(NewMultiTurn(1), 32, 1.1, 7)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for k := range 2000 {
		s, _ := w.Session(k)
		for _, tr := range s.Turns {
			if tr.Model != s.Turns[0].Model {
				t.Fatalf("session %d names two adapters", k)
			}
		}
		counts[s.Turns[0].Model]++
		again, _ := w.Session(k)
		if again.Turns[0].Model != s.Turns[0].Model {
			t.Fatal("not deterministic")
		}
	}
	if counts[AdapterName(0)] < 4*counts[AdapterName(20)] || len(counts) < 20 {
		t.Errorf("not Zipf-like over 32 adapters: %v", counts)
	}
	inner, _ := NewMultiTurn(1).Session(0)
	if inner.Turns[0].Model != "" {
		t.Error("the inner workload's turns were changed")
	}
	for _, bad := range [][2]float64{{-1, 1.1}, {8, 1}, {MaxAdapters + 1, 2}} {
		if _, err := WithAdapters(NewMultiTurn(1), int(bad[0]), bad[1], 1); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
