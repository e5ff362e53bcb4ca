package policy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// cahWorkers returns n ready workers; every call gives new objects with the same ids, as each
// gateway replica has its own.
func cahWorkers(t testing.TB, n int) []*worker.Worker {
	t.Helper()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("http://engine-%d:8000", i)}, worker.BreakerConfig{Disabled: true})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		ws[i] = w
	}
	return ws
}

// cahLoads is a fixed load per worker id, with no reports.
type cahLoads map[string]int64

func (l cahLoads) Load(w *worker.Worker) int64                  { return l[w.ID] }
func (l cahLoads) Report(*worker.Worker) (loadmon.Report, bool) { return loadmon.Report{}, false }

// idReports is a fixed fresh report per worker id (a worker absent from it has none).
type idReports map[string]loadmon.Report

func (l idReports) Load(w *worker.Worker) int64 { r := l[w.ID]; return r.Backlog() }
func (l idReports) Report(w *worker.Worker) (loadmon.Report, bool) {
	r, ok := l[w.ID]
	return r, ok
}

// fakeKV answers Match from a fixed table worker id → tokens held, and tokenizes one token per
// byte; fail makes tokenization fail, blind makes Match unable to answer.
type fakeKV struct {
	held        map[string]int
	fail, blind bool
	tokenized   int
	ctxErr      error // the context's error seen by the last Tokenize
}

func (f *fakeKV) Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	f.tokenized++
	f.ctxErr = ctx.Err()
	if f.fail || ctx.Err() != nil {
		return nil, errors.New("tokenizer down")
	}
	return make([]uint32, len(text)), nil
}

func (f *fakeKV) Covers(string, []string) bool { return !f.blind }

func (f *fakeKV) Match(model string, toks []uint32, ids []string, out []int) bool {
	if f.blind {
		return false
	}
	for i, id := range ids {
		out[i] = min(f.held[id], len(toks))
	}
	return true
}

// costClock is the clock of the policies newCostPolicy builds: tests that give reports a
// PolledAt set it to match, so that no report has aged (Q and S drain with a report's age).
var costClock = &clock{t: time.Unix(1000, 0)}

func newCostPolicy(t testing.TB, name string, kv KVView, loads Loads) *Cost {
	t.Helper()
	costClock.t = time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.KV, cfg.Loads, cfg.NoBackground, cfg.Now = kv, loads, true, costClock.now
	p, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Cost)
}

// TestCostPicksWhatTheFormulaSays: a hand-built fleet of three workers with given Q, S, Ĉ, μ,
// D and B (a replica whose mean uncached prompt is 2,000 tokens); the pick and the recorded
// terms are the formula's, case by case.
func TestCostPicksWhatTheFormulaSays(t *testing.T) {
	polled := time.Unix(1000, 0)
	type fleetWorker struct {
		q, sentTok, rep float64 // Q, this replica's sends since the report, replica estimate
		cached          int     // Ĉ in tokens (the fake tokenizer: one token a byte)
		rate            float64 // μ, tokens/s
		running         int64
		waiting         int64
		gen             float64 // generation throughput, tokens/s
	}
	const prompt = 6000
	tests := []struct {
		name string
		ws   [3]fleetWorker
	}{
		{"a fast engine with a short queue beats a held prefix behind a long one", [3]fleetWorker{
			{q: 8000, rep: 1, cached: 4000, rate: 8000, running: 8, gen: 800},
			{q: 0, sentTok: 1000, rep: 2, rate: 4000},
			{q: 1000, rep: 1, rate: 16000, running: 4, waiting: 1, gen: 1000},
		}},
		{"the held prefix wins once its queue is short", [3]fleetWorker{
			{q: 500, rep: 1, cached: 5000, rate: 8000, running: 8, gen: 800},
			{q: 0, sentTok: 1000, rep: 2, rate: 4000},
			{q: 1000, rep: 1, rate: 16000, running: 4, waiting: 1, gen: 1000},
		}},
		{"what other replicas sent (S × replicas) outweighs an empty report", [3]fleetWorker{
			{q: 0, sentTok: 5000, rep: 8, rate: 8000},
			{q: 9000, rep: 8, rate: 8000},
			{q: 12000, rep: 8, rate: 8000},
		}},
		{"a batch twice the fleet's mean (D) outweighs a little prefill", [3]fleetWorker{
			{q: 0, rep: 1, rate: 8000, running: 400, waiting: 40, gen: 400},
			{q: 800, rep: 1, rate: 8000, running: 100, gen: 400},
			{q: 3000, rep: 1, rate: 8000, running: 100, gen: 400},
		}},
		{"the requests queued behind a miss (B) keep a prompt on its holder", [3]fleetWorker{
			{q: 16000, rep: 1, cached: 5000, rate: 8000},
			{q: 8000, rep: 1, rate: 8000},
			{q: 12000, rep: 1, rate: 8000},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := cahWorkers(t, 3)
			reports := idReports{}
			held := map[string]int{}
			for i, f := range tt.ws {
				reports[ws[i].ID] = loadmon.Report{WaitingUncachedTokens: int64(f.q), HasUncachedTokens: true, HasTokenData: true,
					Running: f.running, Waiting: f.waiting, GenThroughput: f.gen, PolledAt: polled, Replicas: f.rep}
				held[ws[i].ID] = f.cached
			}
			p := newCostPolicy(t, "precise_prefix", &fakeKV{held: held}, reports)
			const meanUncached = 2000 // ū, tokens
			p.sc.meanUncached = meanUncached
			want, wantCost := -1, math.Inf(1)
			costs := make([]float64, 3)
			gen, n := 0.0, 0 // D counts decode steps at the fleet's mean throughput
			for _, f := range tt.ws {
				if f.gen > 0 {
					gen, n = gen+f.gen, n+1
				}
			}
			gen /= float64(max(n, 1))
			for i, f := range tt.ws {
				p.sc.ws[ws[i].ID] = seededCost(p.sc, polled, f.q, f.sentTok, f.rate)
				d := 0.0
				if gen > 0 {
					d = float64(f.running+f.waiting) / gen // the requests at the engine, one step
				}
				b := f.q / meanUncached // the requests that queue behind it while it waits
				costs[i] = (f.q+f.sentTok*f.rep+(prompt-float64(f.cached))*(1+b))/f.rate + d
				if costs[i] < wantCost {
					want, wantCost = i, costs[i]
				}
			}
			req := &Request{Model: "m", Text: strings.Repeat("x", prompt), PromptBytes: prompt}
			got := prepChoose(context.Background(), p, ws, req)
			if got != ws[want] {
				t.Fatalf("picked %s, want worker %d (costs %v)", got.ID, want, costs)
			}
			d := req.Decision
			if !d.HasCost || d.Chosen.Worker != ws[want].ID || math.Abs(d.Chosen.Cost-wantCost) > 1e-9 {
				t.Fatalf("chosen terms %+v, want cost %v", d.Chosen, wantCost)
			}
			f := tt.ws[want]
			if d.Chosen.Queued != f.q || d.Chosen.Sent != f.sentTok*f.rep || d.Chosen.Prompt != prompt ||
				d.Chosen.Cached != float64(f.cached) || d.Chosen.Rate != f.rate ||
				math.Abs(d.Chosen.Behind-f.q/meanUncached) > 1e-9 {
				t.Fatalf("chosen terms %+v do not match worker %d %+v", d.Chosen, want, f)
			}
			second := math.Inf(1)
			for i, c := range costs {
				if i != want {
					second = min(second, c)
				}
			}
			if math.Abs(d.RunnerUp.Cost-second) > 1e-9 || d.RunnerUp.Worker == d.Chosen.Worker {
				t.Fatalf("runner-up %+v, want cost %v", d.RunnerUp, second)
			}
		})
	}
}

// TestCostCountsWhatItSends: a burst between two polls spreads, because every pick adds its
// uncached tokens to S of its worker; a newer report restarts S.
func TestCostCountsWhatItSends(t *testing.T) {
	ws := cahWorkers(t, 4)
	polled := time.Unix(1000, 0)
	reports := idReports{}
	for _, w := range ws {
		reports[w.ID] = loadmon.Report{HasUncachedTokens: true, PolledAt: polled}
	}
	p := newCostPolicy(t, "least_load", nil, reports)
	counts := map[string]int{}
	for i := range 40 {
		req := &Request{Text: fmt.Sprintf("prompt %d", i), PromptBytes: 8000}
		counts[prepChoose(context.Background(), p, ws, req).ID]++
	}
	for _, w := range ws {
		if counts[w.ID] != 10 {
			t.Fatalf("burst spread %v, want 10 each", counts)
		}
	}
	for _, w := range ws {
		reports[w.ID] = loadmon.Report{HasUncachedTokens: true, PolledAt: polled.Add(time.Second)}
	}
	costClock.t = polled.Add(time.Second)
	req := &Request{Text: "after the poll", PromptBytes: 8000}
	prepChoose(context.Background(), p, ws, req)
	if req.Decision.Chosen.Sent != 0 || req.Decision.RunnerUp.Sent != 0 {
		t.Fatalf("S after a new report: %+v / %+v, want 0", req.Decision.Chosen, req.Decision.RunnerUp)
	}
}

// TestCostMeasuresPrefillRate: μ comes from the reports: a worker whose backlog falls by 4000
// tokens a second while it stays busy is measured at 4000 tokens/s.
func TestCostMeasuresPrefillRate(t *testing.T) {
	ws := cahWorkers(t, 1)
	t0 := time.Unix(1000, 0)
	reports := idReports{}
	p := newCostPolicy(t, "least_load", nil, reports)
	for i := range 30 {
		reports[ws[0].ID] = loadmon.Report{HasUncachedTokens: true, WaitingUncachedTokens: int64(100000 - 4000*i), PolledAt: t0.Add(time.Duration(i) * time.Second)}
		costClock.t = t0.Add(time.Duration(i) * time.Second)
		prepChoose(context.Background(), p, ws, &Request{PromptBytes: 4})
	}
	req := &Request{PromptBytes: 4}
	prepChoose(context.Background(), p, ws, req)
	if r := req.Decision.Chosen.Rate; math.Abs(r-4000) > 1 {
		t.Fatalf("measured μ %v, want 4000", r)
	}
}

// TestReplicasAgreeOnANewPrefix: two replicas with different local histories (one has routed
// many other conversations, the other nothing) pick the same worker for a new prefix, on the
// same reports; different new prefixes spread over the fleet.
func TestReplicasAgreeOnANewPrefix(t *testing.T) {
	const n = 8
	t0 := time.Unix(1000, 0)
	reports := idReports{}
	ids := cahWorkers(t, n)
	setReports := func(at time.Time) {
		costClock.t = at
		for i := range n {
			reports[ids[i].ID] = loadmon.Report{HasUncachedTokens: true, WaitingUncachedTokens: int64(10 * (i % 3)),
				HasTokenData: true, Running: 4, GenThroughput: 400, PolledAt: at, Replicas: 2}
		}
	}
	setReports(t0)
	busy, fresh := newCostPolicy(t, "cache_aware_hash", nil, reports), newCostPolicy(t, "cache_aware_hash", nil, reports)
	busyWs, freshWs := cahWorkers(t, n), cahWorkers(t, n)
	for i := range 50 {
		prepChoose(context.Background(), busy, busyWs, &Request{Text: prompt(i, " an old conversation"), PromptBytes: 4000})
	}
	setReports(t0.Add(time.Second)) // the next poll: both replicas' since-poll counts restart
	used := map[string]bool{}
	for i := 100; i < 140; i++ {
		text := prompt(i, " a conversation nobody has seen")
		a := prepChoose(context.Background(), busy, busyWs, &Request{Text: text, PromptBytes: 4000})
		b := prepChoose(context.Background(), fresh, freshWs, &Request{Text: text, PromptBytes: 4000})
		if a.ID != b.ID {
			t.Fatalf("prefix %d: the replicas picked %s and %s", i, a.ID, b.ID)
		}
		used[a.ID] = true
		setReports(t0.Add(time.Duration(i) * time.Second)) // each pick in its own poll interval
	}
	if len(used) < n/2 {
		t.Fatalf("40 new prefixes went to %d workers only", len(used))
	}
}

func prompt(i int, tail string) string {
	return fmt.Sprintf("Tenant %d. ", i) + strings.Repeat(fmt.Sprintf("context of tenant %d ", i), 20) + tail
}

// TestCostFollowsItsTree: the default sends a prefix back where it sent it, and records the
// prediction as a share of the whole prompt.
func TestCostFollowsItsTree(t *testing.T) {
	ws := cahWorkers(t, 4)
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	text := prompt(1, " first turn")
	first := prepChoose(context.Background(), p, ws, &Request{Text: text})
	req := &Request{Text: text + " second turn"}
	if got := prepChoose(context.Background(), p, ws, req); got != first {
		t.Fatalf("second turn went to %s, want %s", got.ID, first.ID)
	}
	d := req.Decision
	if d.Branch != BranchCacheHit || !d.HasPrediction || !d.WholePrompt || d.Predicted < 0.9 {
		t.Fatalf("decision %+v", d)
	}
}

// TestPreciseFollowsEventsOverTheTree: the tree remembers sending a prompt to a worker; the
// events say that worker evicted it and another holds it: the events win.
func TestPreciseFollowsEventsOverTheTree(t *testing.T) {
	ws := cahWorkers(t, 3)
	kv := &fakeKV{held: map[string]int{}}
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	text := strings.Repeat("shared system prompt ", 50)
	kv.held[ws[1].ID] = len(text)
	if got := prepChoose(context.Background(), p, ws, &Request{Model: "m", Text: text}); got != ws[1] {
		t.Fatalf("first pick %s, want the holder %s", got.ID, ws[1].ID)
	}
	kv.held = map[string]int{ws[2].ID: len(text)}
	if got := prepChoose(context.Background(), p, ws, &Request{Model: "m", Text: text}); got != ws[2] {
		t.Fatalf("after the eviction: %s, want %s", got.ID, ws[2].ID)
	}
	d := p.Decisions()
	if d[BranchPreciseHit] != 2 || d[BranchFallbackNoEvents] != 0 {
		t.Fatalf("decisions %v", d)
	}
	if n, _ := p.DecisionTime(); n != 2 {
		t.Fatalf("decision time counted %d decisions", n)
	}
}

// TestPreciseFallsBack: without events or a tokenizer the tree gives Ĉ, exactly as the default
// would, and the counters say why.
func TestPreciseFallsBack(t *testing.T) {
	ws := cahWorkers(t, 2)
	text := strings.Repeat("abc ", 100)
	for name, kv := range map[string]*fakeKV{"blind": {blind: true}, "tokenizer": {fail: true}} {
		t.Run(name, func(t *testing.T) {
			p := newCostPolicy(t, "precise", kv, cahLoads{})
			ref := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
			for i := range 5 {
				req := &Request{Text: fmt.Sprintf("%d %s", i, text)}
				if got, want := p.Pick(context.Background(), ws, req), ref.Pick(context.Background(), ws, req); got.ID != want.ID {
					t.Fatalf("fallback picked %s, cache_aware_hash %s", got.ID, want.ID)
				}
			}
			d := p.Decisions()
			branch := map[string]string{"blind": BranchFallbackNoEvents, "tokenizer": BranchFallbackTokenizer}[name]
			if d[branch] != 5 || d[BranchPreciseHit]+d[BranchPreciseMiss] != 0 {
				t.Fatalf("decisions %v", d)
			}
			// Each decision is counted once, under its fallback branch: the alert on the
			// fallback share divides by the sum over every branch.
			var sum uint64
			for _, n := range d {
				sum += n
			}
			if sum != 5 {
				t.Fatalf("5 decisions counted %d times: %v", sum, d)
			}
			if name == "blind" && kv.tokenized != 0 {
				t.Fatalf("tokenized %d prompts that no event could match", kv.tokenized)
			}
		})
	}
}

// TestPreciseTokenizesUnderTheRequestContext: Prepare tokenizes under the request's context, so
// a client that has left cancels the tokenization, and the pick still answers from the tree.
func TestPreciseTokenizesUnderTheRequestContext(t *testing.T) {
	ws := cahWorkers(t, 2)
	kv := &fakeKV{held: map[string]int{}}
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if w := prepChoose(ctx, p, ws, &Request{Text: "hello"}); w == nil {
		t.Fatal("no pick")
	}
	if !errors.Is(kv.ctxErr, context.Canceled) {
		t.Fatalf("the tokenizer saw context error %v, want the request's cancellation", kv.ctxErr)
	}
	if d := p.Decisions(); d[BranchFallbackTokenizer] != 1 {
		t.Fatalf("decisions %v", d)
	}
}

// TestBestCostHasNoSideEffects: asking the cost records nothing: the next pick is the one a
// policy never asked would make, and the counters and the tree are untouched.
func TestBestCostHasNoSideEffects(t *testing.T) {
	ws := cahWorkers(t, 4)
	asked, plain := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{}), newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	for i := range 20 {
		req := &Request{Text: prompt(i, ""), PromptBytes: 4000}
		s, ok := asked.BestCost(context.Background(), ws, req)
		if !ok || !(s > 0) {
			t.Fatalf("BestCost = %v, %v", s, ok)
		}
		if req.Decision.HasCost {
			t.Fatal("BestCost wrote the caller's decision")
		}
		if a, b := prepChoose(context.Background(), asked, ws, req), prepChoose(context.Background(), plain, ws, &Request{Text: prompt(i, ""), PromptBytes: 4000}); a.ID != b.ID {
			t.Fatalf("after BestCost the pick moved: %s vs %s", a.ID, b.ID)
		}
	}
	if fmt.Sprint(asked.Decisions()) != fmt.Sprint(plain.Decisions()) {
		t.Fatalf("decisions %v vs %v", asked.Decisions(), plain.Decisions())
	}
	if _, ok := asked.BestCost(context.Background(), nil, &Request{}); ok {
		t.Fatal("BestCost without candidates reported a cost")
	}
}

// TestBestCostMeasuresNothing: asking the price at every load report does not change the
// prefill rate the picks measure. The engine's backlog falls 35,000 tokens in one second and
// 5,000 in the next, over and over: a policy that saw every report would measure 35,000
// tokens/s; the picks see every second report only, 40,000 tokens over two seconds, 20,000/s.
func TestBestCostMeasuresNothing(t *testing.T) {
	ws := cahWorkers(t, 1)
	reports := idReports{}
	asked, plain := newCostPolicy(t, "least_load", nil, reports), newCostPolicy(t, "least_load", nil, reports)
	start := costClock.t
	q := int64(1_000_000)
	for k := range 24 {
		if k > 0 {
			if k%2 == 1 {
				q -= 35_000
			} else {
				q -= 5_000
			}
		}
		at := start.Add(time.Duration(k) * time.Second)
		costClock.t = at
		reports[ws[0].ID] = loadmon.Report{HasTokenData: true, HasUncachedTokens: true, WaitingUncachedTokens: q, Waiting: 10, PolledAt: at}
		if _, ok := asked.BestCost(context.Background(), ws, &Request{Text: "x", PromptBytes: 400}); !ok {
			t.Fatal("no cost")
		}
		if k%2 == 1 {
			continue
		}
		ra, rp := &Request{Text: "x", PromptBytes: 400}, &Request{Text: "x", PromptBytes: 400}
		prepChoose(context.Background(), asked, ws, ra)
		prepChoose(context.Background(), plain, ws, rp)
		if ra.Decision.Chosen.Rate != rp.Decision.Chosen.Rate {
			t.Fatalf("report %d: μ %v after BestCost at every report, %v without", k, ra.Decision.Chosen.Rate, rp.Decision.Chosen.Rate)
		}
	}
	if got := plain.Decisions(); got == nil {
		t.Fatal("no decisions")
	}
}

// TestCostHardCaps: a worker over the KV-usage or queue cap is passed over while another is
// under it; when all are over, the cap does not empty the pool.
func TestCostHardCaps(t *testing.T) {
	ws := cahWorkers(t, 2)
	now := time.Unix(1000, 0)
	reports := idReports{
		ws[0].ID: {HasTokenData: true, HasUncachedTokens: true, TokenUsage: 0.99, PolledAt: now},
		ws[1].ID: {HasTokenData: true, HasUncachedTokens: true, TokenUsage: 0.5, WaitingUncachedTokens: 50000, PolledAt: now},
	}
	cfg := DefaultConfig()
	cfg.Loads, cfg.NoBackground, cfg.Now = reports, true, func() time.Time { return now }
	cfg.Cost.MaxTokenUsage = 0.95
	p, err := New("least_load", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Pick(context.Background(), ws, &Request{PromptBytes: 100}); got != ws[1] {
		t.Fatalf("picked %s over its KV cap", got.ID)
	}
	reports[ws[1].ID] = loadmon.Report{HasTokenData: true, HasUncachedTokens: true, TokenUsage: 0.99, WaitingUncachedTokens: 50000, PolledAt: now}
	if got := p.Pick(context.Background(), ws, &Request{PromptBytes: 100}); got != ws[0] {
		t.Fatalf("with both over the cap: %v, want the cheaper worker 0", got)
	}
}

func TestCostConfigValidate(t *testing.T) {
	for name, tweak := range map[string]func(*CostConfig){
		"negative rate": func(c *CostConfig) { c.PrefillRate = -1 },
		"NaN rate":      func(c *CostConfig) { c.PrefillRate = math.NaN() },
		"tie share > 1": func(c *CostConfig) { c.TieShare = 2 },
		"follow > 1":    func(c *CostConfig) { c.FollowShare = 1.5 },
		"delay > 10":    func(c *CostConfig) { c.DelayShare = 11 },
		"NaN delay":     func(c *CostConfig) { c.DelayShare = math.NaN() },
		"max waiting":   func(c *CostConfig) { c.MaxWaiting = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			tweak(&cfg.Cost)
			if err := cfg.Validate(); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestCostConcurrent: decisions from many goroutines at once (run with -race).
func TestCostConcurrent(t *testing.T) {
	ws := cahWorkers(t, 8)
	reports := idReports{}
	for _, w := range ws {
		reports[w.ID] = loadmon.Report{HasUncachedTokens: true, PolledAt: time.Unix(1000, 0)}
	}
	p := newCostPolicy(t, "cache_aware_hash", nil, reports)
	var wg sync.WaitGroup
	var sent [8]atomic.Int64 // picks per worker
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				w := prepChoose(context.Background(), p, ws, &Request{Text: prompt(g*1000+i%20, "tail"), PromptBytes: 2000})
				if w == nil {
					t.Error("no pick")
					return
				}
				sent[slices.Index(ws, w)].Add(1)
				if i%50 == 0 {
					p.Forget(ws[i%8].ID)
				}
			}
		}()
	}
	wg.Wait()
	// Every decision is counted once, whatever ran concurrently with it.
	var n uint64
	for _, c := range p.Decisions() {
		n += c
	}
	if n != 8*200 {
		t.Fatalf("%d decisions counted, want %d", n, 8*200)
	}
	// The sends spread the load: S grows on each pick, so no worker takes most of 160 prompts.
	for i := range sent {
		if c := sent[i].Load(); c > 8*200/2 {
			t.Fatalf("worker %d took %d of %d picks", i, c, 8*200)
		}
	}
}

// TestCostCountsTheRequestsBehind works B through by hand: a prompt of 6,000 tokens, 5,000 of
// them held by worker 0 behind 16,000 queued tokens; worker 1 holds none behind 8,000; ū is
// 2,000 tokens, μ 8,000 tokens/s. Greedy (DelayShare 0): 17,000 ÷ 8,000 = 2.125 s against
// 14,000 ÷ 8,000 = 1.75 s, worker 1. DelayShare 1: B = 8 and 4 requests, (16,000 + 1,000 × 9) ÷
// 8,000 = 3.125 s against (8,000 + 6,000 × 5) ÷ 8,000 = 4.75 s, worker 0. DelayShare 0.5: B = 4
// and 2, 2.625 s against 3.25 s, worker 0.
func TestCostCountsTheRequestsBehind(t *testing.T) {
	polled := time.Unix(1000, 0)
	for _, tt := range []struct {
		share      float64
		want       int
		behind     float64 // B of the chosen worker
		cost, next float64 // the chosen's cost and the runner-up's, seconds
	}{
		{0, 1, 0, 1.75, 2.125},
		{1, 0, 8, 3.125, 4.75},
		{0.5, 0, 4, 2.625, 3.25},
	} {
		t.Run(fmt.Sprint(tt.share), func(t *testing.T) {
			ws := cahWorkers(t, 2)
			reports := idReports{}
			for i, q := range []int64{16000, 8000} {
				reports[ws[i].ID] = loadmon.Report{WaitingUncachedTokens: q, HasUncachedTokens: true, HasTokenData: true,
					PolledAt: polled, Replicas: 1}
			}
			p := newCostPolicy(t, "precise_prefix", &fakeKV{held: map[string]int{ws[0].ID: 5000}}, reports)
			p.sc.cfg.DelayShare = tt.share
			p.sc.meanUncached = 2000
			for i, q := range []float64{16000, 8000} {
				p.sc.ws[ws[i].ID] = seededCost(p.sc, polled, q, 0, 8000)
			}
			req := &Request{Model: "m", Text: strings.Repeat("x", 6000), PromptBytes: 6000}
			if got := prepChoose(context.Background(), p, ws, req); got != ws[tt.want] {
				t.Fatalf("picked %s, want worker %d (decision %+v)", got.ID, tt.want, req.Decision)
			}
			d := req.Decision
			if math.Abs(d.Chosen.Behind-tt.behind) > 1e-9 || math.Abs(d.Chosen.Cost-tt.cost) > 1e-9 ||
				math.Abs(d.RunnerUp.Cost-tt.next) > 1e-9 {
				t.Fatalf("chosen %+v, runner-up %+v; want B %v, costs %v and %v", d.Chosen, d.RunnerUp, tt.behind, tt.cost, tt.next)
			}
		})
	}
}

// TestOwnerIsCreditedWhatNoTreeHolds: behind 8 replicas, this replica sent a conversation's
// first 3,000 characters (750 tokens) to a worker that is not the prompt's rendezvous owner; its
// next turn, 4,000 characters (1,000 tokens), goes back there. The owner is credited only the 250
// tokens the tree places nowhere (f = 1: share 1), not 7/8 of the prompt (875 tokens, which beat
// the holder's 750 and pulled the conversation off it).
func TestOwnerIsCreditedWhatNoTreeHolds(t *testing.T) {
	polled := time.Unix(1000, 0)
	ws := cahWorkers(t, 3)
	reports := idReports{}
	for _, w := range ws {
		reports[w.ID] = loadmon.Report{HasUncachedTokens: true, HasTokenData: true, PolledAt: polled, Replicas: 8}
	}
	p := newCostPolicy(t, "cache_aware_hash", nil, reports)
	turn1 := strings.Repeat("a conversation, ", 200)[:3000]
	turn2 := turn1 + strings.Repeat("and its next turn ", 60)[:1000]
	key := hashString(placementKey(turn2, 0))
	owner, holder := 0, -1
	for i, w := range ws {
		if scoreHashed(key, idHash(w.ID)) > scoreHashed(key, idHash(ws[owner].ID)) {
			owner = i
		}
	}
	holder = (owner + 1) % len(ws)
	p.Record(&Request{Model: "m", Text: turn1, PromptBytes: len(turn1)}, ws[holder])
	// A newer report: what Record counted as sent is in it now.
	later := polled.Add(time.Second)
	for id, r := range reports {
		r.PolledAt = later
		reports[id] = r
	}
	costClock.t = later
	req := &Request{Model: "m", Text: turn2, PromptBytes: len(turn2)}
	if got := prepChoose(context.Background(), p, ws, req); got != ws[holder] {
		t.Fatalf("picked %s, want the holder %s (decision %+v)", got.ID, ws[holder].ID, req.Decision)
	}
	d := req.Decision
	if d.Chosen.Cached != 750 || d.RunnerUp.Worker != ws[owner].ID || d.RunnerUp.Cached != 250 {
		t.Fatalf("chosen %+v, runner-up %+v; want Ĉ 750 on the holder and 250 on the owner %s", d.Chosen, d.RunnerUp, ws[owner].ID)
	}
}

// TestOwnerCreditShare works the credit's share through by hand: f × (1 − 1/R) ÷ (1 − f/R) of
// what the tree places nowhere (6,000 − 2,000 = 4,000 tokens) on the rendezvous owner.
func TestOwnerCreditShare(t *testing.T) {
	for _, tt := range []struct {
		f, replicas, credit float64
	}{
		{1, 8, 4000},         // (7/8) ÷ (7/8) = 1
		{0.5, 2, 4000.0 / 3}, // 0.25 ÷ 0.75
		{1, 1, 0},            // one replica's tree sees everything
		{0, 8, 0},            // nothing is taken as sent before
	} {
		p := NewCacheAwareHash(Config{NoBackground: true, Cost: CostConfig{FollowShare: tt.f, PrefillRate: 8000, BytesPerToken: 4}})
		ws := cahWorkers(t, 3)
		av := make([]costCand, len(ws))
		for i, w := range ws {
			av[i] = costCand{w: w, fresh: true, idHash: idHash(w.ID), r: report{replicas: tt.replicas},
				t: Terms{Worker: w.ID, Prompt: 6000}}
		}
		const key = 42
		owner := 0
		for i := range av {
			if scoreHashed(key, av[i].idHash) > scoreHashed(key, av[owner].idHash) {
				owner = i
			}
		}
		av[owner].t.Cached = 500        // the owner's own prefix
		av[(owner+1)%3].t.Cached = 2000 // the longest the tree places
		p.creditOwner(av, key, 2000)
		if math.Abs(av[owner].t.Credit-tt.credit) > 1e-9 || math.Abs(av[owner].t.Cached-500-tt.credit) > 1e-9 {
			t.Errorf("f %v, R %v: credit %v (Ĉ %v), want %v", tt.f, tt.replicas, av[owner].t.Credit, av[owner].t.Cached, tt.credit)
		}
		p.Close()
	}
}

// TestTTFTLeavesOutTheDelayBehind: the prediction a client is held to (calibration metrics,
// admission by a TTFT objective) is the prompt's own wait; the cost a pick minimises adds the
// delay its prefill causes the B requests behind it. Hand-worked: Q 4,000, S 1,000, P 3,000,
// Ĉ 1,000, B 2, μ 1,000 tokens/s, D 0.25 s.
func TestTTFTLeavesOutTheDelayBehind(t *testing.T) {
	tm := Terms{Queued: 4000, Sent: 1000, Prompt: 3000, Cached: 1000, Behind: 2, Rate: 1000, Decode: 0.25}
	if got, want := tm.TTFT(), (4000+1000+2000)/1000.0+0.25; got != want {
		t.Errorf("TTFT = %v, want %v", got, want)
	}
	if got, want := tm.Formula(), (4000+1000+2000*3)/1000.0+0.25; got != want {
		t.Errorf("Formula = %v, want %v", got, want)
	}
}

// TestPromptRatePricesTheMissAlone: with μp, the rate one prompt prefills at (an engine's own
// counters), the prompt's own miss is priced at μp and the queue ahead and the delay to the
// requests behind at the queue's μ. Hand-worked: Q 4,000, S 1,000, P 3,000, Ĉ 1,000, B 2,
// μ 8,000, μp 1,000 tokens/s, D 0.25 s; and an engine of 8 slots that prefills each prompt at
// 1,000 tokens/s loses a 2,000-token miss to one that holds the prompt behind 8,000 queued.
func TestPromptRatePricesTheMissAlone(t *testing.T) {
	tm := Terms{Queued: 4000, Sent: 1000, Prompt: 3000, Cached: 1000, Behind: 2, Rate: 8000, PromptRate: 1000, Decode: 0.25}
	if got, want := tm.TTFT(), (4000+1000)/8000.0+2000/1000.0+0.25; math.Abs(got-want) > 1e-12 {
		t.Errorf("TTFT = %v, want %v", got, want)
	}
	if got, want := tm.Formula(), (4000+1000+2000*2)/8000.0+2000/1000.0+0.25; math.Abs(got-want) > 1e-12 {
		t.Errorf("Formula = %v, want %v", got, want)
	}
	tm.PromptRate = 0 // unknown: the miss at μ, as before
	if got, want := tm.Formula(), (4000+1000+2000*3)/8000.0+0.25; math.Abs(got-want) > 1e-12 {
		t.Errorf("Formula without μp = %v, want %v", got, want)
	}
	holder := Terms{Queued: 8000, Prompt: 2000, Cached: 2000, Rate: 8000, PromptRate: 1000}
	idle := Terms{Prompt: 2000, Rate: 8000, PromptRate: 1000}
	if h, i := holder.Formula(), idle.Formula(); h >= i {
		t.Errorf("holder %v ≥ idle %v: the miss at the prompt's own 1,000 tokens/s costs 2 s, the queue 1 s", h, i)
	}
	holder.PromptRate, idle.PromptRate = 0, 0 // one rate: the queue and the miss both at 8,000
	if h, i := holder.Formula(), idle.Formula(); h <= i {
		t.Errorf("with one rate, holder %v ≤ idle %v: want the idle engine (0.25 s against 1 s)", h, i)
	}
}

// seededCost is a worker's state that follows the report polled at polled, with q tokens queued
// at it, sentTok uncached tokens this replica sent since and μ measured at rate.
func seededCost(sc *scorer, polled time.Time, q, sentTok, rate float64) *workerCost {
	st := &workerCost{}
	st.est.Observe(polled, q, 0, 0, loadmon.Busy{}, &sc.est)
	st.est.ObserveQueueRate(rate, &sc.est)
	if sentTok > 0 {
		st.est.Sent(loadmon.Own, sentTok, sentTok)
	}
	return st
}

// TestFilterReasons: every reason a candidate is out of a decision is applied in one place and
// counted: already tried (a retry), cannot start (flow control), unavailable, capped.
func TestFilterReasons(t *testing.T) {
	ws := cahWorkers(t, 4)
	ws[3].SetHealth(worker.NotReady)
	p := newCostPolicy(t, "least_load", nil, cahLoads{})
	req := &Request{Tried: []*worker.Worker{ws[0]}}
	if got := prepChoose(context.Background(), p, ws, req); got == ws[0] || got == ws[3] {
		t.Fatalf("picked %s: tried or unavailable", got.ID)
	}
	if f := req.Decision.Filtered; f[FilterTried] != 1 {
		t.Fatalf("filtered %v, want 1 tried", f)
	}
	req = &Request{Startable: func(c []*worker.Worker) []*worker.Worker { return c[2:] }}
	if got := prepChoose(context.Background(), p, ws, req); got != ws[2] {
		t.Fatalf("picked %s, want the one startable available worker", got.ID)
	}
	if f := req.Decision.Filtered; f[FilterCannotStart] != 2 || f[FilterUnavailable] != 1 {
		t.Fatalf("filtered %v, want 2 that cannot start and 1 unavailable", f)
	}
	if got := p.Filtered(); got["tried"] != 1 || got["cannot_start"] != 2 || got["unavailable"] != 1 {
		t.Fatalf("counts %v", got)
	}
	// Every candidate tried: all again.
	req = &Request{Tried: ws}
	if got := prepChoose(context.Background(), p, ws, req); got == nil || got == ws[3] {
		t.Fatal("no pick when every worker was tried")
	}
}

// prepChoose is the gateway's sequence for one request: Prepare, then Choose.
func prepChoose(ctx context.Context, p Policy, candidates []*worker.Worker, req *Request) *worker.Worker {
	Prepare(ctx, p, candidates, req)
	return Choose(ctx, p, candidates, req)
}

// TestRatesReportMeasuredMu: Rates (kvgate_worker_prefill_rate_tokens_per_second) gives each
// worker's μ once its reports measured it, and leaves out a worker still priced at the default.
func TestRatesReportMeasuredMu(t *testing.T) {
	sc := newScorer(DefaultConfig().Cost, nil, time.Now)
	t0 := time.Unix(1000, 0)
	busy := func(tok, sec float64) loadmon.Busy {
		return loadmon.Busy{Tokens: tok, Seconds: sec, Counted: true}
	}
	m := sc.state("measured")
	m.est.Observe(t0, 0, 1, 0, busy(0, 0), &sc.est)
	m.est.Observe(t0.Add(time.Second), 0, 1, 0, busy(6_000, 0.75), &sc.est) // 8,000 tokens/s
	u := sc.state("unmeasured")
	u.est.Observe(t0, 0, 1, 0, loadmon.Busy{}, &sc.est)
	got := sc.rates()
	if len(got) != 1 || got["measured"] != 8_000 {
		t.Fatalf("rates %v, want only measured at 8000", got)
	}
}
