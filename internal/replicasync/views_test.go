package replicasync

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKeptSumsAreSearchedSums: the sums kept for the last moment asked, updated as entries
// arrive (and fold into the base past the window), equal exactly what a search of the ring
// gives, through moments that move on, repeat and go back, and receipt times that tie.
func TestKeptSumsAreSearchedSums(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 2))
	for _, window := range []int{1, 3, 16} {
		var kept, searched cumRing
		at := int64(1000)
		moment := at
		for step := range 4000 {
			switch r.IntN(4) {
			case 0: // the report moves on, or an older one is asked again
				moment = at - int64(r.IntN(40))
			default:
				at += int64(r.IntN(3)) // ties, as several records of one batch
				if r.IntN(8) == 0 {
					at -= 5 // a receipt time before the last is clamped
				}
				v := float64(r.IntN(3000))
				kept.add(at, v, window)
				searched.add(at, v, window)
			}
			sum, n := kept.sinceKept(moment)
			if want, wantN := searched.since(moment), len64(searched, moment); sum != want || n != wantN {
				t.Fatalf("window %d, step %d, since %d: kept %v over %d entries, searched %v over %d", window, step, moment, sum, n, want, wantN)
			}
		}
	}
}

// TestPlacedManyCandidates: the placement lookup over more candidates than a stack buffer
// holds allocates nothing, and a worker named twice gets the same answer at both positions.
func TestPlacedManyCandidates(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	a, b := newTestNode(t, c, Config{}), newTestNode(t, c, Config{})
	prompt := strings.Repeat("system prompt ", 100)
	a.Decided("m", "w7", prompt, "", 300)
	a.Decided("m", "w90", prompt[:600], "", 300)
	deliver(t, a, b)
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "w" + strconv.Itoa(i)
	}
	ids[50] = "w7" // named twice
	out := make([]int, len(ids))
	if n := testing.AllocsPerRun(20, func() { b.Placed("m", prompt, ids, out) }); n != 0 {
		t.Errorf("Placed over %d candidates allocates %v times", len(ids), n)
	}
	for i, got := range out {
		want := 0
		switch i {
		case 7, 50:
			want = len(prompt)
		case 90:
			want = 2 * ChunkBytes
		}
		if got != want {
			t.Errorf("out[%d] (%s) = %d, want %d", i, ids[i], got, want)
		}
	}
}
