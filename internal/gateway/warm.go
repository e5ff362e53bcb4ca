package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// warmer warms a worker that joins a pool (Config.Warm): it asks the pool's policy for the hot
// prefixes other workers hold (policy.PlanWarm), sends the new worker each as a one-token
// completion through the forwarder (so the worker's API key, in-flight count, circuit breaker
// and timeouts apply as to any request), and once every request has ended records the prefixes
// that succeeded as held by the new worker. From then on the hit path can send their traffic to
// it as to any holder, and it answers them from its own cache instead of paying a full prefill
// for each live request, which is what spilling hits to an empty worker costs
// (docs/routing.md §14.1).
//
// Until the warm-up ends the worker is held out of routing (worker.SetWarming), when every pool
// it joins has another available worker, and recording waits for the whole warm-up: a request
// sent to the worker meanwhile, a hit on a prefix recorded early or a new prompt placed there,
// would queue behind the warm prefill (measured: TTFT p99 1.0 s and 0.79 s in the window of
// the join instead of 24 ms and 0.10 s, docs/routing.md §14.2).
//
// One warm-up runs per joining regular worker, bounded by Config.Warm (prefixes, estimated
// tokens, requests at once, total time), between Start and Stop. It is cancelled when the worker
// leaves (then nothing is recorded: its policies have forgotten it) or the gateway stops. Prefill
// and decode workers of a disaggregated pool are not warmed. Warm requests carry no client data
// beyond the prefixes clients sent, and no prompt text is ever logged.
type warmer struct {
	s   *Server
	cfg policy.WarmConfig

	mu   sync.Mutex
	ctx  context.Context           // Start's; nil before Start and after Stop
	runs map[*worker.Worker]func() // worker → cancel of its warm-up
	wg   sync.WaitGroup
	seq  atomic.Uint64 // numbers warm-ups in request ids
	// ended, when set (by tests), is called as each warm-up ends, with what it recorded.
	ended func(w *worker.Worker, recorded int)

	requests *prometheus.CounterVec
	tokens   prometheus.Counter
	recorded prometheus.Counter
}

func newWarmer(s *Server, cfg policy.WarmConfig) *warmer {
	wm := &warmer{s: s, cfg: cfg.WithDefaults(), runs: map[*worker.Worker]func(){},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_warm_requests_total", Help: "Warm-up requests sent to joining workers, by outcome (ok, failed).",
		}, []string{"outcome"}),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_warm_prompt_tokens_total", Help: "Prompt tokens of the warm-up requests sent, estimated at 4 bytes a token.",
		}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_warm_prefixes_recorded_total", Help: "Prefixes recorded as held by a joining worker after its warm-up.",
		}),
	}
	wm.requests.WithLabelValues("ok")
	wm.requests.WithLabelValues("failed")
	s.metrics.reg.MustRegister(wm.requests, wm.tokens, wm.recorded)
	return wm
}

// start lets warm-ups run under ctx until stop.
func (wm *warmer) start(ctx context.Context) {
	wm.mu.Lock()
	wm.ctx = ctx
	wm.mu.Unlock()
}

// stop cancels every warm-up and waits for them to exit. Later joins are not warmed.
func (wm *warmer) stop() {
	wm.mu.Lock()
	wm.ctx = nil
	for _, cancel := range wm.runs {
		cancel()
	}
	wm.mu.Unlock()
	wm.wg.Wait()
}

// onEvent starts a warm-up when a regular worker joins and cancels it when the worker leaves.
// It runs before the gateway's own removal handler (which makes the policies forget the
// worker), so a warm-up never records for a worker that has been forgotten.
func (wm *warmer) onEvent(e worker.Event) {
	w := e.Worker
	wm.mu.Lock()
	defer wm.mu.Unlock()
	if e.Removed {
		if cancel := wm.runs[w]; cancel != nil {
			cancel()
			delete(wm.runs, w)
		}
		return
	}
	if wm.ctx == nil || !wm.cfg.Enabled() || w.Spec.Type != worker.Regular {
		return
	}
	if wm.othersAvailable(w) {
		w.SetWarming(true) // routed nothing until the warm-up ends; warm() lets it go
	}
	ctx, cancel := context.WithTimeout(wm.ctx, wm.cfg.Timeout)
	wm.runs[w] = cancel
	wm.wg.Add(1)
	go func() {
		defer wm.wg.Done()
		defer cancel()
		defer wm.forget(w)
		defer w.SetWarming(false)
		wm.warm(ctx, w)
	}()
}

// othersAvailable reports whether every pool w joins has another available worker, so that
// holding w out of routing during its warm-up leaves no model without a worker.
func (wm *warmer) othersAvailable(w *worker.Worker) bool {
	v := wm.s.reg.View()
	for _, m := range w.Spec.Models {
		p := v.Pool(m)
		if p == nil || !slices.ContainsFunc(p.Regular, func(o *worker.Worker) bool { return o != w && o.Available() }) {
			return false
		}
	}
	return true
}

// warmPlan is one model's share of a warm-up.
type warmPlan struct {
	model string
	pol   policy.Policy
	texts []string
}

// warm runs the warm-up of w: plan, send, record, log.
func (wm *warmer) warm(ctx context.Context, w *worker.Worker) {
	recorded := 0
	if wm.ended != nil {
		defer func() { wm.ended(w, recorded) }()
	}
	start := time.Now()
	var plans []warmPlan
	total := 0
	for _, m := range w.Spec.Models {
		p, err := wm.s.router.For(m, worker.Regular)
		if err != nil {
			continue
		}
		if texts := policy.PlanWarm(p, w.ID, wm.cfg, start, wm.s.cfg.RoutingPrefixBytes); len(texts) > 0 {
			plans = append(plans, warmPlan{model: m, pol: p, texts: texts})
			total += len(texts)
		}
	}
	if total == 0 {
		wm.s.log.Debug("worker not warmed: its pools hold no hot prefix", "worker", w.ID)
		return
	}
	if w.Health() != worker.Ready || w.Draining() {
		wm.s.log.Info("worker not warmed: not ready when it joined", "worker", w.ID, "prefixes", total)
		return
	}
	ok := wm.send(ctx, w, plans)
	recorded = wm.record(ctx, w, plans, ok)
	failed := total - countTrue(ok)
	wm.s.log.Info("worker warmed", "worker", w.ID, "prefixes", total, "ok", total-failed, "failed", failed,
		"recorded", recorded, "cancelled", errors.Is(ctx.Err(), context.Canceled),
		"duration", time.Since(start).Round(time.Millisecond))
}

// send sends every planned prompt to w, at most Concurrency at once, and reports which
// succeeded (in plan order, across models). It returns when all have ended or ctx is done.
func (wm *warmer) send(ctx context.Context, w *worker.Worker, plans []warmPlan) []bool {
	type job struct {
		i     int
		model string
		text  string
	}
	var jobs []job
	for _, p := range plans {
		for _, t := range p.texts {
			jobs = append(jobs, job{len(jobs), p.model, t})
		}
	}
	ok := make([]bool, len(jobs))
	next := make(chan job)
	var senders sync.WaitGroup
	run := "kvgate-warm-" + strconv.FormatUint(wm.seq.Add(1), 10) + "-"
	for range min(wm.cfg.Concurrency, len(jobs)) {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for j := range next {
				ok[j.i] = wm.sendOne(ctx, w, j.model, j.text, run+strconv.Itoa(j.i)) == nil
			}
		}()
	}
feed:
	for _, j := range jobs {
		select {
		case next <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	senders.Wait()
	return ok
}

// warmBody is the request a warm-up sends: the prefix as a completion prompt, one token out.
type warmBody struct {
	Model       string  `json:"model"`
	Prompt      string  `json:"prompt"`
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	Stream      bool    `json:"stream"`
}

// errWarmCancelled is a warm request not sent because its warm-up ended first.
var errWarmCancelled = errors.New("warm-up ended")

// sendOne sends one warm request and counts it.
func (wm *warmer) sendOne(ctx context.Context, w *worker.Worker, model, text, requestID string) error {
	if ctx.Err() != nil {
		return errWarmCancelled
	}
	body, err := json.Marshal(warmBody{Model: model, Prompt: text, MaxTokens: 1})
	if err != nil {
		return err
	}
	wm.tokens.Add(float64(policy.WarmTokens(text)))
	h := http.Header{"Content-Type": []string{"application/json"}}
	err = wm.s.fwd.Discard(ctx, w, &proxy.Request{Path: "/v1/completions", Header: h, Body: body, RequestID: requestID})
	if err != nil {
		wm.requests.WithLabelValues("failed").Inc()
		wm.s.log.Debug("warm request failed", "worker", w.ID, "err", err)
		return err
	}
	wm.requests.WithLabelValues("ok").Inc()
	return nil
}

// record records the prefixes that succeeded for w, unless the warm-up was cancelled (the
// worker left, or the gateway stops) — its deadline passing is no cancellation: what succeeded
// by then is recorded. It holds mu so that a removal cannot slip between the check and the
// records. It returns how many it recorded.
func (wm *warmer) record(ctx context.Context, w *worker.Worker, plans []warmPlan, ok []bool) int {
	wm.mu.Lock()
	defer wm.mu.Unlock()
	if _, live := wm.runs[w]; !live || wm.ctx == nil || errors.Is(ctx.Err(), context.Canceled) {
		return 0
	}
	n, i := 0, 0
	for _, p := range plans {
		for _, t := range p.texts {
			if ok[i] {
				policy.Warmed(p.pol, w.ID, t)
				n++
			}
			i++
		}
	}
	wm.recorded.Add(float64(n))
	w.SetWarming(false) // holder of what it was sent, it takes traffic from now on
	return n
}

// forget drops w's warm-up from the table once it has ended (a removal may have dropped it).
func (wm *warmer) forget(w *worker.Worker) {
	wm.mu.Lock()
	delete(wm.runs, w)
	wm.mu.Unlock()
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
