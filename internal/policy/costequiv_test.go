package policy

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// refGather is the scorer's gather step as written before the pool view: it looks every
// candidate's report and state up by id at every decision. It shares terms, capped and the rate
// measurement with gather, which the view did not change.
func refGather(s *scorer, dst []costCand, candidates []*worker.Worker, prompt float64) []costCand {
	av := dst[:0]
	pin, pinned := s.loads.(*loadmon.Monitor)
	var snap loadmon.Pinned
	if pinned {
		snap = pin.Pin()
	}
	for _, w := range candidates {
		if !w.Available() {
			continue
		}
		var r loadmon.Report
		var fresh bool
		if pinned {
			r, fresh = snap.Report(w)
		} else {
			r, fresh = s.loads.Report(w)
		}
		av = append(av, costCand{w: w, r: reportOf(&r), fresh: fresh, t: Terms{Worker: w.ID, Prompt: prompt}})
	}
	av = s.capped(av)
	var gen, running float64
	n := 0
	for i := range av {
		if av[i].fresh && av[i].r.gen > 0 {
			gen += av[i].r.gen
			running += float64(av[i].r.running)
			n++
		}
	}
	if n > 0 {
		gen = max(gen, running) / float64(n)
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range av {
		st := s.ws[av[i].w.ID]
		if st == nil {
			st = &workerCost{idHash: idHash(av[i].w.ID)}
			s.ws[av[i].w.ID] = st
		}
		av[i].st = st
		s.terms(&av[i], now, gen)
	}
	return av
}

// refChoose is the pick step as written before it was one pass: price and least, ties, runner-up
// and the most cached, each a pass of its own.
func refChoose(s *scorer, av []costCand, key uint64) (best, runner int, most float64) {
	least := 0
	for i := range av {
		av[i].t.Cached = min(max(av[i].t.Cached, 0), av[i].t.Prompt)
		av[i].t.price()
		if av[i].t.Cost < av[least].t.Cost {
			least = i
		}
	}
	eps := s.cfg.TieSeconds + s.cfg.TieShare*av[least].t.Cost
	best = least
	var bestScore uint64
	n := 0
	for i := range av {
		if av[i].t.Cost > av[least].t.Cost+eps {
			continue
		}
		n++
		if sc := scoreHashed(key, av[i].idHash); n == 1 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	runner = -1
	for i := range av {
		if i != best && (runner < 0 || av[i].t.Cost < av[runner].t.Cost) {
			runner = i
		}
	}
	for i := range av {
		most = max(most, av[i].t.Cached)
	}
	return best, runner, most
}

// equivFleet is n ready workers behind one loopback server whose /v1/loads answers change with
// every polling round (round), seeded, some of them with only request counts.
func equivFleet(t *testing.T, n int, round *atomic.Int64) ([]*worker.Worker, *worker.Registry) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/w"), "%d", &i); err != nil || !strings.HasSuffix(r.URL.Path, "/v1/loads") {
			http.NotFound(w, r)
			return
		}
		g := rand.New(rand.NewPCG(uint64(i), uint64(round.Load())))
		uncached := ""
		if i%5 != 0 { // every fifth worker reports request counts only
			uncached = fmt.Sprintf(`,"num_waiting_uncached_tokens":%d`, g.IntN(40000))
		}
		fmt.Fprintf(w, `{"loads":[{"num_running_reqs":%d,"num_waiting_reqs":%d%s,"token_usage":%.3f,"gen_throughput":%d}]}`,
			g.IntN(16), g.IntN(5), uncached, g.Float64(), g.IntN(900))
	}))
	t.Cleanup(srv.Close)
	reg := worker.NewRegistry()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("%s/w%d", srv.URL, i), Runtime: "sglang", Models: []string{"m"}}, worker.BreakerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	return ws, reg
}

// TestScorerMatchesReference runs a seeded sequence of decisions — new reports, reports going
// stale, workers leaving and coming back, forgotten, candidate lists reordered and cut, sends
// committed — through the scorer and through the reference (refGather, refChoose) side by side,
// and requires the same candidates, every term of each, the same pick, runner-up and most cached
// at every step, with the hard caps off and on, against a real load monitor and a plain Loads.
func TestScorerMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		name    string
		caps    bool
		monitor bool
	}{{"monitor", false, true}, {"monitor-caps", true, true}, {"loads", false, false}, {"loads-caps", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var round atomic.Int64
			ws, reg := equivFleet(t, 24, &round)
			var mu sync.Mutex
			clock := time.Unix(1_700_000_000, 0)
			now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
			advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
			cfg := DefaultCostConfig()
			cfg.RateSamples = 1 // measured rates take part early
			if tc.caps {
				cfg.MaxTokenUsage, cfg.MaxWaiting = 0.7, 3
			}
			var loads Loads
			var mon *loadmon.Monitor
			plain := idReports{}
			if tc.monitor {
				mon = loadmon.New(reg, loadmon.Config{Logger: slog.New(slog.DiscardHandler), Now: now})
				t.Cleanup(mon.Stop)
				loads = mon
			} else {
				loads = plain
			}
			poll := func() {
				round.Add(1)
				if mon != nil {
					mon.PollOnce(context.Background())
					return
				}
				g := rand.New(rand.NewPCG(99, uint64(round.Load())))
				for _, w := range ws {
					if g.IntN(6) == 0 {
						delete(plain, w.ID) // no report
						continue
					}
					plain[w.ID] = loadmon.Report{Running: g.Int64N(16), Waiting: g.Int64N(5), WaitingUncachedTokens: g.Int64N(40000),
						HasUncachedTokens: g.IntN(4) != 0, HasTokenData: true, TokenUsage: g.Float64(), GenThroughput: float64(g.IntN(900)),
						PolledAt: now().Add(-time.Duration(g.IntN(500)) * time.Millisecond), Replicas: float64(1 + g.IntN(3))}
				}
			}
			checkEquivalence(t, ws, cfg, loads, now, advance, poll)
		})
	}
}

// checkEquivalence is TestScorerMatchesReference's sequence over ws, poll publishing new
// reports and advance moving the clock that now reads.
func checkEquivalence(t *testing.T, ws []*worker.Worker, cfg CostConfig, loads Loads, now func() time.Time,
	advance func(time.Duration), poll func()) {
	t.Helper()
	poll()
	got, want := newScorer(cfg, loads, now), newScorer(cfg, loads, now)
	g := rand.New(rand.NewPCG(20, 7))
	pool := ws
	var releases []func()
	var bufA, bufB []costCand
	for step := range 3000 {
		switch op := g.IntN(100); {
		case op < 3:
			poll()
		case op < 6:
			advance(time.Duration(g.IntN(2500)) * time.Millisecond) // reports may go stale
		case op < 9:
			w := ws[g.IntN(len(ws))]
			w.SetHealth(map[bool]worker.Health{true: worker.Ready, false: worker.Pending}[!w.Available()])
		case op < 11:
			id := ws[g.IntN(len(ws))].ID
			got.forget(id)
			want.forget(id)
		case op < 16: // another candidate list: a shuffled, cut copy
			pool = append([]*worker.Worker(nil), ws...)
			g.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
			pool = pool[:1+g.IntN(len(pool))]
		case op < 18:
			pool = ws
		case op < 22:
			releases = append(releases, pool[g.IntN(len(pool))].Acquire())
		case op < 25 && len(releases) > 0:
			releases[0]()
			releases = releases[1:]
		}
		advance(time.Duration(g.IntN(40)) * time.Millisecond)
		prompt := float64(g.IntN(20000))
		a := got.gather(bufA, pool, prompt, &Request{}, g.IntN(10) != 0, false) // now and then a one-off list
		b := refGather(want, bufB, pool, prompt)
		if len(a) != len(b) {
			t.Fatalf("step %d: %d candidates, reference %d", step, len(a), len(b))
		}
		if len(a) == 0 {
			continue
		}
		for i := range a {
			c := float64(g.IntN(24000)) - 2000 // some over P, some negative
			a[i].t.Cached, b[i].t.Cached = c, c
		}
		key := g.Uint64()
		best, runner, most := got.choose(a, key)
		rb, rr, rm := refChoose(want, b, key)
		if best != rb || runner != rr || most != rm {
			t.Fatalf("step %d: chose %d, runner-up %d, most %v; reference %d, %d, %v", step, best, runner, most, rb, rr, rm)
		}
		for i := range a {
			if a[i].w != b[i].w || a[i].fresh != b[i].fresh || a[i].r != b[i].r || a[i].ahead != b[i].ahead ||
				a[i].idHash != b[i].idHash || a[i].t != b[i].t {
				t.Fatalf("step %d, candidate %d: %+v, reference %+v", step, i, a[i], b[i])
			}
		}
		got.commit(&a[best], a[best].t.Prompt-a[best].t.Cached)
		want.commit(&b[best], b[best].t.Prompt-b[best].t.Cached)
		bufA, bufB = a[:0], b[:0]
	}
	for _, r := range releases {
		r()
	}
	for _, w := range ws {
		w.SetHealth(worker.Ready)
	}
}
