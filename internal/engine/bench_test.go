package engine

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sharedPrefix generates the shared-prefix workload: 16 system prompts of about 200
// words; 70 % of requests start with one, then a unique tail of 16–128 words; 64 output tokens;
// Poisson arrivals.
type sharedPrefix struct {
	rng     *rand.Rand
	systems []string
	words   []string
	rate    float64
	now     time.Duration
	n       uint64
}

func newSharedPrefix(seed uint64, rate float64) *sharedPrefix {
	w := &sharedPrefix{rng: rand.New(rand.NewPCG(seed, 99)), rate: rate}
	for i := range 512 {
		w.words = append(w.words, fmt.Sprintf("w%x%s", i, strings.Repeat("o", i%7)))
	}
	for range 16 {
		w.systems = append(w.systems, w.sentence(200))
	}
	return w
}

func (w *sharedPrefix) sentence(words int) string {
	var b strings.Builder
	for range words {
		b.WriteString(w.words[w.rng.IntN(len(w.words))])
		b.WriteByte(' ')
	}
	return b.String()
}

// next returns the next request, its arrival time and its system prompt (-1 for none).
func (w *sharedPrefix) next() (Request, time.Duration, int) {
	w.now += time.Duration(w.rng.ExpFloat64() / w.rate * float64(time.Second))
	w.n++
	sys, text := -1, w.sentence(16+w.rng.IntN(113))
	if w.rng.Float64() < 0.7 {
		sys = w.rng.IntN(len(w.systems))
		text = w.systems[sys] + text
	}
	return Request{ID: w.n, Text: text, MaxTokens: 64}, w.now, sys
}

// fleetHeap orders engines by their next event.
type fleetHeap struct {
	at  []time.Duration
	idx []int // heap position → engine
	pos []int // engine → heap position
}

func (h *fleetHeap) Len() int           { return len(h.idx) }
func (h *fleetHeap) Less(i, j int) bool { return h.at[h.idx[i]] < h.at[h.idx[j]] }
func (h *fleetHeap) Swap(i, j int) {
	h.idx[i], h.idx[j] = h.idx[j], h.idx[i]
	h.pos[h.idx[i]], h.pos[h.idx[j]] = i, j
}
func (h *fleetHeap) Push(any) { panic("fixed size") }
func (h *fleetHeap) Pop() any { panic("fixed size") }

const never = time.Duration(1<<63 - 1)

// arrival is one request of a workload.
type arrival struct {
	r   Request
	at  time.Duration
	sys int
}

// sharedPrefixArrivals returns the shared-prefix workload's requests arriving within dur.
func sharedPrefixArrivals(seed uint64, rate float64, dur time.Duration) []arrival {
	w := newSharedPrefix(seed, rate)
	var out []arrival
	for {
		r, at, sys := w.next()
		if at > dur {
			return out
		}
		out = append(out, arrival{r, at, sys})
	}
}

// fleetResult summarizes one simulated fleet run.
type fleetResult struct {
	finished           int
	ttftSum            time.Duration
	prompt, cached     int
	wall, simulated    time.Duration
	maxWaiting, events int
}

// simulateFleet drives engines engines in virtual time for dur under the shared-prefix
// workload at rate requests per second, routing each system prompt to one engine (as cache-aware
// routing would) and the rest round-robin, with a discrete-event loop over NextEvent.
func simulateFleet(tb testing.TB, cfg Config, engines int, reqs []arrival, dur time.Duration) fleetResult {
	es := make([]*Engine, engines)
	h := &fleetHeap{at: make([]time.Duration, engines), idx: make([]int, engines), pos: make([]int, engines)}
	for i := range es {
		es[i] = mustNew(tb, cfg)
		h.at[i], h.idx[i], h.pos[i] = never, i, i
	}
	resched := func(i int) {
		at, ok := es[i].NextEvent()
		if !ok {
			at = never
		}
		h.at[i] = at
		heap.Fix(h, h.pos[i])
	}
	var res fleetResult
	var evs []Event
	collect := func(i int, now time.Duration) {
		evs = es[i].Advance(now, evs[:0])
		for _, ev := range evs {
			res.events++
			if ev.Kind == Finished {
				res.finished++
				res.ttftSum += ev.TTFT
				res.prompt += ev.PromptTokens
				res.cached += ev.CachedTokens
			}
		}
		resched(i)
	}
	rr := 0
	for _, a := range reqs {
		if a.at > dur {
			break
		}
		for h.at[h.idx[0]] <= a.at {
			i := h.idx[0]
			collect(i, h.at[i])
		}
		target := a.sys
		if a.sys < 0 || engines < 16 {
			target = rr % engines
			rr++
		}
		if err := es[target].Submit(a.at, a.r); err != nil {
			tb.Fatal(err)
		}
		res.maxWaiting = max(res.maxWaiting, es[target].Load().Waiting)
		collect(target, a.at)
	}
	for h.at[h.idx[0]] <= dur {
		collect(h.idx[0], h.at[h.idx[0]])
	}
	res.simulated = dur
	return res
}

func TestSimulatedFleetIsSane(t *testing.T) {
	res := simulateFleet(t, DefaultConfig(), 8, sharedPrefixArrivals(1, 20, 30*time.Second), 30*time.Second)
	if res.finished < 500 {
		t.Fatalf("only %d requests finished", res.finished)
	}
	hit := float64(res.cached) / float64(res.prompt)
	ttft := res.ttftSum / time.Duration(res.finished)
	if hit < 0.3 || ttft <= 0 || ttft > time.Second {
		t.Errorf("hit rate %.2f, mean TTFT %v", hit, ttft)
	}
}

// BenchmarkFleet64 measures how much faster than real time the engine model runs: 64 engines,
// 100 requests/s of the shared-prefix workload, 60 simulated seconds per iteration (the workload
// is generated once, outside the timing). sim-s/wall-s is the speed-up over real time (target ≥
// 1000); sim-s/cpu-s divides by the process's CPU time instead, which stays meaningful when
// other jobs share the machine. The fast sub-benchmark is the fleet simulator's mode; tokens
// runs the same fleet with an event per decode step (Config.EmitTokens), the side-by-side
// baseline that shows what decode runs save.
func BenchmarkFleet64(b *testing.B) {
	const dur = 60 * time.Second
	reqs := sharedPrefixArrivals(1, 100, dur)
	for _, mode := range []struct {
		name   string
		tokens bool
		timing TimingModel
	}{{"fast", false, TimingBatched}, {"tokens", true, TimingBatched}, {"per-slot-fast", false, TimingPerSlot}, {"per-slot-tokens", true, TimingPerSlot}} {
		b.Run(mode.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.EmitTokens, cfg.Timing = mode.tokens, mode.timing
			var res fleetResult
			cpu0 := cpuTime()
			start := time.Now()
			for b.Loop() {
				res = simulateFleet(b, cfg, 64, reqs, dur)
			}
			wall, cpu := time.Since(start), cpuTime()-cpu0
			sim := float64(b.N) * dur.Seconds()
			b.ReportMetric(sim/wall.Seconds(), "sim-s/wall-s")
			b.ReportMetric(sim/cpu.Seconds(), "sim-s/cpu-s")
			b.ReportMetric(float64(res.events)/dur.Seconds(), "events/sim-s")
			b.ReportMetric(float64(res.cached)/float64(res.prompt), "hit-rate")
			b.ReportMetric(float64(res.ttftSum/time.Duration(res.finished))/1e6, "mean-ttft-ms")
		})
	}
}

// BenchmarkTokenize measures the tokenizer and block keying of a 2 KB prompt.
func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("You are a careful assistant. ", 80)[:2048]
	b.SetBytes(int64(len(text)))
	var keys []uint64
	for b.Loop() {
		keys = blockKeysText(keys[:0], text, 16)
	}
}

// cpuTime returns the user plus system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
