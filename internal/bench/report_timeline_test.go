package bench

import (
	"strings"
	"testing"
	"time"
)

func TestParseChanges(t *testing.T) {
	cs, err := ParseChanges("remove@60s, remove:http://127.0.0.1:31003@1m30s,add:http://127.0.0.1:31008@2m")
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{{At: time.Minute, Remove: true}, {At: 90 * time.Second, Remove: true, Arg: "http://127.0.0.1:31003"}, {At: 2 * time.Minute, Arg: "http://127.0.0.1:31008"}}
	if len(cs) != len(want) {
		t.Fatalf("got %v", cs)
	}
	for i := range want {
		if cs[i] != want[i] {
			t.Fatalf("change %d: %+v, want %+v", i, cs[i], want[i])
		}
	}
	for _, bad := range []string{"remove", "drop@1s", "add@-1s", "add@1s,remove@0s", "remove@soon"} {
		if _, err := ParseChanges(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestRecoveryAfter: a hand-built timeline whose hit rate dips after an event and comes back;
// the recovery time, the worst relative hit and the added worker's share are as worked out.
func TestRecoveryAfter(t *testing.T) {
	var tl Timeline
	tl.Bucket = 10 * time.Second
	// 100 requests of 100 prompt tokens per window; cached per window: 80 before 60 s, then 40,
	// 60, 79, 80, 80, ...; from 60 s on, "new" answers a tenth of them, uncached.
	hits := []int{80, 80, 80, 80, 80, 80, 40, 60, 79, 80, 80, 80}
	for w, h := range hits {
		for i := 0; i < 100; i++ {
			r := Record{Sent: time.Duration(w)*tl.Bucket + time.Duration(i)*time.Millisecond, PromptTokens: 100, TTFT: time.Millisecond, Worker: "old"}
			if i < h {
				r.CachedTokens = 100
			}
			if w >= 6 && i >= 90 {
				r.Worker = "new"
			}
			tl.Add(r)
		}
	}
	tl.Add(Record{Sent: 65 * time.Second, Err: "boom"})
	pts := tl.Points()
	r := RecoveryAfter(pts, nil, "add new", "new", 0, 60, 0, 0.02)
	if r.Steady != 0.8 || r.Errors != 1 {
		t.Fatalf("steady %v errors %d, want 0.8 and 1", r.Steady, r.Errors)
	}
	// Smoothed over 3 windows from 60 s: 40/80=0.5, 100/200 → 0.625, 179/300, 219/300, 239/300
	// (0.9958 ≥ 0.98 from the window at 100 s).
	if r.Worst != 0.5 || r.RecoverySec != 40 {
		t.Fatalf("worst %v recovery %v, want 0.5 and 40 s", r.Worst, r.RecoverySec)
	}
	// "old" answered 90 a window from 60 s on, all of the cached ones: (40+60+79+80+80+80)/540.
	if r.AddedShare != 0.1 || r.OthersHit != 0.7759 {
		t.Fatalf("added share %v others hit %v", r.AddedShare, r.OthersHit)
	}
	// Against a baseline identical to the run, nothing was lost.
	if b := RecoveryAfter(pts, pts, "x", "", 0, 60, 0, 0.02); b.Worst != 1 || b.RecoverySec != 0 || !b.Baseline {
		t.Fatalf("against itself: %+v", b)
	}
}

// TestCollectorPredictionAccuracy: the mean absolute and signed errors of the predictions.
func TestCollectorPredictionAccuracy(t *testing.T) {
	var c Collector
	c.Add(Record{PromptTokens: 100, CachedTokens: 50, Predicted: 0.7, HasPrediction: true, TTFT: time.Millisecond})
	c.Add(Record{PromptTokens: 100, CachedTokens: 100, Predicted: 0.9, HasPrediction: true, TTFT: time.Millisecond})
	c.Add(Record{PromptTokens: 100, CachedTokens: 100, TTFT: time.Millisecond}) // no prediction
	s := c.Summarize("x")
	if s.Predicted != 2 || s.PredictionMAE != 0.15 || s.PredictionBias != 0.05 {
		t.Fatalf("predicted %d MAE %v bias %v, want 2, 0.15, +0.05", s.Predicted, s.PredictionMAE, s.PredictionBias)
	}
}

// FuzzParseChanges: no input panics, and what parses survives a round trip through String.
func FuzzParseChanges(f *testing.F) {
	for _, s := range []string{"remove@60s", "remove:3@1m,add@2m", "add:http://127.0.0.1:31008@120s", "x@", "@@@", "remove:@1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cs, err := ParseChanges(s)
		if err != nil {
			return
		}
		parts := make([]string, len(cs))
		for i, c := range cs {
			parts[i] = c.String()
		}
		again, err := ParseChanges(strings.Join(parts, ","))
		if err != nil || len(again) != len(cs) {
			t.Fatalf("%q parsed to %v, which reparses to %v, %v", s, cs, again, err)
		}
		for i := range cs {
			if again[i] != cs[i] {
				t.Fatalf("%q: change %d %+v became %+v", s, i, cs[i], again[i])
			}
		}
	})
}
