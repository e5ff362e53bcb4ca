package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
)

// TestFailoverSchedule: a removed engine gets no request sent after its removal (those in flight
// finish: no error), an added one takes requests, the timeline covers the run, and each change
// is judged against the same run without it.
func TestFailoverSchedule(t *testing.T) {
	changes, err := bench.ParseChanges("remove:1@20s,add@40s")
	if err != nil {
		t.Fatal(err)
	}
	x := &Experiment{
		Base:     Config{Engines: 4, Seed: 1, Failover: changes, Timeline: 5 * time.Second},
		Policies: []string{"cache_aware_hash", "round_robin"},
		Workload: bench.NewMultiTurn(1),
		Arrivals: bench.Arrivals{Rate: 3},
		Limits:   bench.Limits{Duration: 60 * time.Second},
		Seed:     1,
	}
	rows, err := x.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Errors != 0 {
			t.Fatalf("%s: %d errors, want none: a drained engine finishes its requests", r.Label, r.Errors)
		}
		if len(r.Timeline) < 12 || len(r.Recoveries) != 2 {
			t.Fatalf("%s: %d windows, %d recoveries; want ≥ 12 and 2", r.Label, len(r.Timeline), len(r.Recoveries))
		}
		var added int
		for _, pt := range r.Timeline {
			// A request sent in the window after the removal's (20–25 s) cannot reach engine-1.
			if pt.At >= 25 && pt.Workers["engine-1"].Requests > 0 {
				t.Fatalf("%s: engine-1 answered %d requests sent at %v s, after its removal", r.Label, pt.Workers["engine-1"].Requests, pt.At)
			}
			if pt.At < 40 && pt.Workers["engine-4"].Requests > 0 {
				t.Fatalf("%s: engine-4 answered before it was added", r.Label)
			}
			added += pt.Workers["engine-4"].Requests
		}
		rec := r.Recoveries[1]
		if added == 0 || rec.Added != "engine-4" || rec.AddedShare <= 0 || !rec.Baseline {
			t.Fatalf("%s: the added engine took %d requests; recovery %+v", r.Label, added, rec)
		}
	}
	for _, fo := range [][]bench.Change{
		{{Remove: true, Arg: "x"}},                        // not an index
		{{Arg: "http://127.0.0.1:31009"}},                 // an addition naming a URL
		{{Remove: true}, {At: 1, Remove: true, Arg: "1"}}, // every engine
		{{At: 2, Remove: true}, {At: 1}},                  // out of order
	} {
		if err := (Config{Engines: 2, Failover: fo}).Validate(); err == nil {
			t.Errorf("schedule %v was accepted", fo)
		}
	}
}
