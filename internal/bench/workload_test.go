package bench

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestWorkloadsAreDeterministic(t *testing.T) {
	for _, name := range []string{"shared-prefix", "multi-turn", "long-context"} {
		t.Run(name, func(t *testing.T) {
			a, _ := NewWorkload(name, 7)
			b, _ := NewWorkload(name, 7)
			c, _ := NewWorkload(name, 8)
			// Ask b for sessions in reverse order: content must not depend on call order.
			var bs []Session
			for k := 19; k >= 0; k-- {
				s, _ := b.Session(k)
				bs = append([]Session{s}, bs...)
			}
			differs := false
			for k := 0; k < 20; k++ {
				sa, ok := a.Session(k)
				if !ok {
					t.Fatalf("session %d missing", k)
				}
				if !reflect.DeepEqual(sa, bs[k]) {
					t.Fatalf("session %d differs between two generators with one seed", k)
				}
				sc, _ := c.Session(k)
				if !reflect.DeepEqual(sa, sc) {
					differs = true
				}
			}
			if !differs {
				t.Fatal("seed 7 and seed 8 gave the same sessions")
			}
		})
	}
}

func TestSharedPrefixShape(t *testing.T) {
	w := NewSharedPrefix(1)
	shared := 0
	prefixes := map[string]string{}
	const n = 4000
	for k := 0; k < n; k++ {
		s, _ := w.Session(k)
		if len(s.Turns) != 1 || s.Turns[0].OutputTokens != 64 {
			t.Fatalf("session %d: %d turns, %d output tokens", k, len(s.Turns), s.Turns[0].OutputTokens)
		}
		tr := s.Turns[0]
		sys, tail := tr.Messages[0].Content, tr.Messages[1].Content
		if tw := len(strings.Fields(tail)); tw < 16 || tw > 128 {
			t.Fatalf("tail of %d words", tw)
		}
		if sw := len(strings.Fields(sys)); sw < 180 || sw > 225 {
			t.Fatalf("system prompt of %d words", sw)
		}
		if tr.PrefixID != "" {
			shared++
			if p, ok := prefixes[tr.PrefixID]; ok && p != sys {
				t.Fatalf("prefix %s has two texts", tr.PrefixID)
			}
			prefixes[tr.PrefixID] = sys
		}
		if !strings.HasPrefix(tr.Text(), sys) {
			t.Fatal("routing text does not start with the system prompt")
		}
	}
	if share := float64(shared) / n; share < 0.67 || share > 0.73 {
		t.Fatalf("shared share %.3f, want about 0.70", share)
	}
	if len(prefixes) != 16 {
		t.Fatalf("%d distinct prefixes, want 16", len(prefixes))
	}
}

func TestMultiTurnResendsHistory(t *testing.T) {
	w := NewMultiTurn(3)
	for k := 0; k < 50; k++ {
		s, _ := w.Session(k)
		if n := len(s.Turns); n < 3 || n > 10 {
			t.Fatalf("%d turns", n)
		}
		if s.Turns[0].Think != 0 {
			t.Fatal("first turn has think time")
		}
		for i := 1; i < len(s.Turns); i++ {
			prev, cur := s.Turns[i-1], s.Turns[i]
			if len(cur.Messages) != len(prev.Messages)+2 {
				t.Fatalf("turn %d has %d messages after %d", i, len(cur.Messages), len(prev.Messages))
			}
			if !strings.HasPrefix(cur.Text(), prev.Text()) {
				t.Fatalf("turn %d does not resend turn %d's prompt", i, i-1)
			}
			if got := len(strings.Fields(cur.Messages[len(cur.Messages)-2].Content)); got != prev.OutputTokens {
				t.Fatalf("assistant reply of %d words, want the %d requested", got, prev.OutputTokens)
			}
		}
	}
}

func TestLongContextTenants(t *testing.T) {
	w := NewLongContext(5)
	seen := map[string]bool{}
	for k := 0; k < 2000; k++ {
		s, _ := w.Session(k)
		seen[s.Turns[0].PrefixID] = true
		if n := len(strings.Fields(s.Turns[0].Messages[0].Content)); n < 5400 || n > 6700 {
			t.Fatalf("context of %d words", n)
		}
	}
	if len(seen) < 140 || len(seen) > 150 {
		t.Fatalf("%d tenants seen in 2000 requests, want nearly all 150", len(seen))
	}
}

func TestNewWorkloadErrors(t *testing.T) {
	for _, name := range []string{"trace", "bogus"} {
		if _, err := NewWorkload(name, 1); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestSchedule(t *testing.T) {
	w := NewSharedPrefix(1)
	t.Run("open loop stops at duration", func(t *testing.T) {
		s, err := NewSchedule(w, Arrivals{Rate: 100}, Limits{Duration: 10 * time.Second}, 1)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		var last time.Duration
		for {
			_, at, ok := s.NextSession()
			if !ok {
				break
			}
			if at < last {
				t.Fatal("arrivals go back in time")
			}
			last = at
			n++
		}
		if n < 900 || n > 1100 {
			t.Fatalf("%d arrivals in 10 s at 100/s", n)
		}
	})
	t.Run("request limit", func(t *testing.T) {
		s, _ := NewSchedule(w, Arrivals{Concurrency: 4}, Limits{Requests: 3}, 1)
		got := 0
		for i := 0; i < 10; i++ {
			if s.Admit(0) {
				got++
			}
		}
		if got != 3 || !s.Done(0) {
			t.Fatalf("admitted %d, done %v", got, s.Done(0))
		}
	})
	bad := []struct {
		name string
		a    Arrivals
		l    Limits
		want string
	}{
		{"no arrivals", Arrivals{}, Limits{Requests: 1}, "rate"},
		{"both", Arrivals{Rate: 1, Concurrency: 1}, Limits{Requests: 1}, "not both"},
		{"negative rate", Arrivals{Rate: -1}, Limits{Requests: 1}, ">= 0"},
		{"unbounded", Arrivals{Rate: 1}, Limits{}, "bound the run"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSchedule(w, tc.a, tc.l, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
