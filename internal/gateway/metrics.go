package gateway

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// Metrics holds the gateway's Prometheus metrics (prefix kvgate_) in a registry of its own, so
// that tests and several gateways in one process never share state.
type Metrics struct {
	reg *prometheus.Registry

	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	ttft       *prometheus.HistogramVec
	selections *prometheus.CounterVec
	upstream   *prometheus.CounterVec
	retries    *prometheus.CounterVec
	exhausted  *prometheus.CounterVec
	healthTo   *prometheus.CounterVec
	circuitTo  *prometheus.CounterVec

	predictionError   *prometheus.HistogramVec
	predictionMissing *prometheus.CounterVec
	// predictedTTFT and ttftError calibrate the cost model (costmetrics.go).
	predictedTTFT, ttftError *prometheus.HistogramVec

	// hostile counts strays and held request bodies (hostilemetrics.go).
	hostile *hostileMetrics

	// hot caches the children of the metrics above that every routed request updates.
	hot hotCache
}

var _ proxy.Observer = (*Metrics)(nil)

func newMetrics(reg *worker.Registry, router *policy.Router, loads policy.Loads) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_requests_total", Help: "Client requests by route, model and status.",
		}, []string{"route", "model", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_request_duration_seconds", Help: "Client request duration, until the response was fully relayed.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route", "model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_ttft_seconds", Help: "Time to the first streamed byte relayed to the client.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"model"}),
		selections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_policy_selections_total", Help: "Workers picked, by policy, model and worker.",
		}, []string{"policy", "model", "worker"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_upstream_errors_total", Help: "Failed upstream attempts by worker and kind.",
		}, []string{"worker", "kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_retries_total", Help: "Attempts retried, by the reason the previous one failed.",
		}, []string{"reason"}),
		exhausted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_retries_exhausted_total", Help: "Requests whose last allowed attempt failed, by reason.",
		}, []string{"reason"}),
		healthTo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_worker_health_transitions_total", Help: "Health-state changes by worker and new state.",
		}, []string{"worker", "to"}),
		circuitTo: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_worker_circuit_transitions_total", Help: "Circuit-breaker state changes by worker and new state.",
		}, []string{"worker", "to"}),
	}
	m.hot.children.Store(&map[hotKey]hotChild{})
	m.hostile = newHostileMetrics(m.reg)
	m.predictionError, m.predictionMissing = auditMetrics()
	m.predictedTTFT, m.ttftError = costMetrics()
	m.reg.MustRegister(m.predictionError, m.predictionMissing, sessionCollector{router}, m.predictedTTFT, m.ttftError)
	m.reg.MustRegister(m.requests, m.duration, m.ttft, m.selections, m.upstream, m.retries, m.exhausted, m.healthTo, m.circuitTo,
		&workerCollector{reg: reg, router: router, loads: loads},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry returns the Prometheus registry, for tests and for other components' collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

func (m *Metrics) observeRequest(route, model string, status int, d time.Duration) {
	m.child(hotKey{metric: hotRequests, label: route, model: model, status: status}).counter.Inc()
	m.child(hotKey{metric: hotDuration, label: route, model: model}).observer.Observe(d.Seconds())
}

func (m *Metrics) selected(pol, model string, w *worker.Worker) {
	m.child(hotKey{metric: hotSelections, label: pol, model: model, worker: w.ID}).counter.Inc()
}

// UpstreamError implements proxy.Observer.
func (m *Metrics) UpstreamError(w *worker.Worker, kind proxy.Kind) {
	m.upstream.WithLabelValues(w.ID, kind.String()).Inc()
}

// Retry implements proxy.Observer.
func (m *Metrics) Retry(reason string) { m.retries.WithLabelValues(reason).Inc() }

// RetriesExhausted implements proxy.Observer.
func (m *Metrics) RetriesExhausted(reason string) { m.exhausted.WithLabelValues(reason).Inc() }

// workerCollector reads per-worker state and per-policy statistics at scrape time, so the hot
// path updates only its atomics.
type workerCollector struct {
	reg    *worker.Registry
	router *policy.Router
	loads  policy.Loads
}

var (
	descInflight  = prometheus.NewDesc("kvgate_worker_inflight", "Requests this gateway has in flight to the worker.", []string{"worker", "url"}, nil)
	descProcessed = prometheus.NewDesc("kvgate_worker_processed_total", "Requests this gateway finished on the worker.", []string{"worker", "url"}, nil)
	descHealth    = prometheus.NewDesc("kvgate_worker_health", "1 for the worker's current health state (pending, ready, not_ready).", []string{"worker", "state"}, nil)
	descCircuit   = prometheus.NewDesc("kvgate_worker_circuit_state", "1 for the worker's current circuit state (closed, open, half_open).", []string{"worker", "state"}, nil)
	descEffective = prometheus.NewDesc("kvgate_worker_effective_load", "The worker's effective load as the policies see it.", []string{"worker"}, nil)
	descReported  = prometheus.NewDesc("kvgate_worker_reported_backlog", "Running plus waiting requests the worker last reported (absent when stale).", []string{"worker"}, nil)
	descReportAge = prometheus.NewDesc("kvgate_worker_load_report_age_seconds", "Age of the worker's last load report (absent before the first).", []string{"worker"}, nil)
	descUsage     = prometheus.NewDesc("kvgate_worker_token_usage", "KV-cache usage the worker last reported (absent when stale).", []string{"worker"}, nil)
	descDecisions = prometheus.NewDesc("kvgate_policy_decisions_total", "Policy decisions by branch.", []string{"policy", "model", "branch"}, nil)
	descTree      = prometheus.NewDesc("kvgate_policy_tree_chars", "Characters held in the prefix tree per worker.", []string{"policy", "model", "worker"}, nil)
	descCalib     = prometheus.NewDesc("kvgate_prefix_prediction_bias", "Moving average over a worker's last 256 answers of the predicted minus the reported cached share of the prompt (positive: the policy believes the worker holds more than it does).", []string{"policy", "model", "worker"}, nil)
	descCapacity  = prometheus.NewDesc("kvgate_prefix_tree_capacity_tokens", "The tokens a worker's engine was shown by its answers to keep cached: the prefix tree hides the worker's records once that many prompt tokens were newly cached on it since (absent until an answer showed a lost prefix).", []string{"policy", "model", "worker"}, nil)
	descRate      = prometheus.NewDesc("kvgate_worker_prefill_rate_tokens_per_second", "The prefill rate the cost prices a worker's queue at (μ): measured from the engine's prefill-busy counters, else from its queue's falls; absent until measured (the cost then takes --prefill-rate).", []string{"policy", "model", "worker"}, nil)
	descDrifts    = prometheus.NewDesc("kvgate_kv_index_drifts_total", "Times precise_prefix found a worker's events index disagreeing with what its answers report cached, and scored it by the prefix tree instead.", []string{"policy", "model", "worker"}, nil)
	descDrifting  = prometheus.NewDesc("kvgate_kv_index_drifting", "1 while a worker's events index disagrees with its answers (scored by the prefix tree), else 0.", []string{"policy", "model", "worker"}, nil)
	descTreeHeld  = prometheus.NewDesc("kvgate_policy_tree_held_chars", "Characters held by every prefix tree of the gateway together.", nil, nil)
	descTreeMax   = prometheus.NewDesc("kvgate_policy_tree_budget_chars", "The gateway-wide prefix-tree budget (--tree-budget); absent when there is none.", nil, nil)
)

func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInflight, descProcessed, descHealth, descCircuit, descEffective, descReported, descReportAge, descUsage, descDecisions, descTree, descCalib, descCapacity, descRate, descDrifts, descDrifting, descTreeHeld, descTreeMax} {
		ch <- d
	}
}

func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, w := range c.reg.View().All {
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(w.Inflight()), w.ID, w.Spec.URL)
		ch <- prometheus.MustNewConstMetric(descProcessed, prometheus.CounterValue, float64(w.Processed()), w.ID, w.Spec.URL)
		for _, h := range []worker.Health{worker.Pending, worker.Ready, worker.NotReady} {
			ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, b2f(w.Health() == h), w.ID, h.String())
		}
		st := w.Breaker.State(now)
		for _, s := range []worker.CircuitState{worker.Closed, worker.Open, worker.HalfOpen} {
			ch <- prometheus.MustNewConstMetric(descCircuit, prometheus.GaugeValue, b2f(st == s), w.ID, s.String())
		}
		if c.loads != nil {
			ch <- prometheus.MustNewConstMetric(descEffective, prometheus.GaugeValue, float64(c.loads.Load(w)), w.ID)
			if r, ok := c.loads.Report(w); ok {
				ch <- prometheus.MustNewConstMetric(descReported, prometheus.GaugeValue, float64(r.Backlog()), w.ID)
				ch <- prometheus.MustNewConstMetric(descUsage, prometheus.GaugeValue, r.TokenUsage, w.ID)
			}
		}
	}
	if wl, ok := c.loads.(interface{ WorkerLoads() []loadmon.WorkerLoad }); ok {
		for _, l := range wl.WorkerLoads() {
			if l.Entry != nil {
				ch <- prometheus.MustNewConstMetric(descReportAge, prometheus.GaugeValue, l.AgeSeconds, l.ID)
			}
		}
	}
	if b := c.router.Config().Budget; b != nil {
		ch <- prometheus.MustNewConstMetric(descTreeHeld, prometheus.GaugeValue, float64(b.Held()))
		ch <- prometheus.MustNewConstMetric(descTreeMax, prometheus.GaugeValue, float64(b.Max()))
	}
	for _, pp := range c.router.Policies() {
		p, model := pp.Policy, pp.Label()
		if d, ok := p.(policy.DecisionReporter); ok {
			for branch, n := range d.Decisions() {
				ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(n), p.Name(), model, branch)
			}
		}
		if t, ok := p.(policy.TreeReporter); ok {
			for wid, n := range t.TreeSizes() {
				ch <- prometheus.MustNewConstMetric(descTree, prometheus.GaugeValue, float64(n), p.Name(), model, wid)
			}
		}
		if c, ok := p.(policy.Calibrator); ok {
			for wid, e := range c.Calibration() {
				ch <- prometheus.MustNewConstMetric(descCalib, prometheus.GaugeValue, e, p.Name(), model, wid)
			}
		}
		if c, ok := p.(policy.CapacityReporter); ok {
			for wid, n := range c.Capacities() {
				ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, n, p.Name(), model, wid)
			}
		}
		if r, ok := p.(policy.RateReporter); ok {
			for wid, mu := range r.Rates() {
				ch <- prometheus.MustNewConstMetric(descRate, prometheus.GaugeValue, mu, p.Name(), model, wid)
			}
		}
		if d, ok := p.(policy.DriftReporter); ok {
			for wid, s := range d.Drifts() {
				ch <- prometheus.MustNewConstMetric(descDrifts, prometheus.CounterValue, float64(s.Count), p.Name(), model, wid)
				ch <- prometheus.MustNewConstMetric(descDrifting, prometheus.GaugeValue, b2f(s.Drifting), p.Name(), model, wid)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
