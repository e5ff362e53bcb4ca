package loadmon

import (
	"testing"
	"time"
)

// TestStatedBatch: the running batch an engine states in /v1/loads (max_running_requests,
// summed over its ranks) is its Slots at once, bounded to [1, MaxSlots] whatever the body says;
// an engine that states none is still learned from a report with requests waiting.
func TestStatedBatch(t *testing.T) {
	cfg := DefaultEstimateConfig()
	cases := []struct {
		name   string
		ranks  string
		slots  int64
		stated bool
	}{
		{"one rank", `{"num_running_reqs": 1, "max_running_requests": 4}`, 4, true},
		{"summed over ranks", `{"max_running_requests": 4}, {"max_running_requests": 4.0}`, 8, true},
		{"fractional", `{"max_running_requests": 3.6}`, 4, true},
		{"huge", `{"max_running_requests": 1e300}`, MaxSlots, true},
		{"ranks summed past the cap", `{"max_running_requests": 60000}, {"max_running_requests": 60000}`, MaxSlots, true},
		{"negative", `{"max_running_requests": -8}`, 0, false},
		{"zero", `{"max_running_requests": 0}`, 0, false},
		{"null", `{"max_running_requests": null}`, 0, false},
		{"absent", `{"num_running_reqs": 3}`, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseLoads([]byte(`{"loads": [` + c.ranks + `]}`))
			if err != nil {
				t.Fatal(err)
			}
			var e Estimate
			e.Observe(est0, 0, r.Running, r.Waiting, Busy{}, &cfg)
			e.ObserveBatch(r.MaxRunning)
			if e.Slots() != c.slots || e.SlotsStated() != c.stated {
				t.Fatalf("slots %d stated %v, want %d %v", e.Slots(), e.SlotsStated(), c.slots, c.stated)
			}
		})
	}
	// A statement that is no number fails the body, as encoding/json would: no batch from it.
	if _, err := ParseLoads([]byte(`{"loads": [{"max_running_requests": "64"}]}`)); err == nil {
		t.Fatal("a string max_running_requests was accepted")
	}
}

// TestStatedBatchOverLearned: a stated batch wins over the running count of a report with
// requests waiting (an engine short of KV runs fewer than its batch; the KV bound judges that),
// and once an engine stops stating it, the learned batch is back.
func TestStatedBatchOverLearned(t *testing.T) {
	cfg := DefaultEstimateConfig()
	var e Estimate
	e.Observe(est0, 0, 3, 2, Busy{}, &cfg) // full at 3
	if e.Slots() != 3 || e.SlotsStated() {
		t.Fatalf("slots %d stated %v, want 3 learned", e.Slots(), e.SlotsStated())
	}
	e.ObserveBatch(8)
	if e.Slots() != 8 || !e.SlotsStated() {
		t.Fatalf("slots %d stated %v, want the stated 8", e.Slots(), e.SlotsStated())
	}
	e.Observe(est0.Add(time.Second), 0, 3, 2, Busy{}, &cfg)
	e.ObserveBatch(0)
	if e.Slots() != 3 || e.SlotsStated() {
		t.Fatalf("slots %d stated %v, want the learned 3 back", e.Slots(), e.SlotsStated())
	}
}
