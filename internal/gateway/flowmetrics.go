package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/flow"
	"github.com/kvgate/kvgate/internal/worker"
)

// flowLabels are the labels of the queue's per-request metrics. Their cardinality is bounded:
// models are the registered pools, bands at most flow.MaxPriority−flow.MinPriority+1, tenants the
// configured names plus flow.OtherTenant.
type flowLabels struct {
	model  string
	band   int
	tenant string
}

func (l flowLabels) values() []string { return []string{l.model, strconv.Itoa(l.band), l.tenant} }

// waitObserver is a child of kvgate_queue_wait_seconds.
type waitObserver = prometheus.Observer

// flowMetrics are flow control's metrics.
type flowMetrics struct {
	queue    *prometheus.GaugeVec
	wait     *prometheus.HistogramVec
	sheds    *prometheus.CounterVec
	canceled *prometheus.CounterVec
}

func newFlowMetrics(*flow.Tenants) *flowMetrics {
	return &flowMetrics{
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_queue_requests", Help: "Requests waiting in the gateway's queue, by model, priority band and tenant (configured names; others are \"other\").",
		}, []string{"model", "band", "tenant"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_queue_wait_seconds", Help: "Time admitted requests waited in the queue before their dispatch (0 when admitted at once), by model, band and tenant.",
			Buckets: []float64{0, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"model", "band", "tenant"}),
		sheds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_queue_shed_total", Help: "Requests flow control answered itself (429 or 503), by model and reason.",
		}, []string{"model", "reason"}),
		canceled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_queue_canceled_total", Help: "Queued requests whose client left before their dispatch, by model.",
		}, []string{"model"}),
	}
}

func (m *flowMetrics) shed(model string, r flow.Reason) {
	m.sheds.WithLabelValues(model, string(r)).Inc()
}

var descSaturation = prometheus.NewDesc("kvgate_pool_saturation",
	"How close each model's pool is to its saturation point, in [0,1]: the mean over its regular workers of each engine's requests against its capacity, its KV usage against the bound and the routing cost's predicted wait against the bound (1 for an unavailable worker or an empty pool).",
	[]string{"model"}, nil)

// saturationCollector computes kvgate_pool_saturation at scrape time.
type saturationCollector struct{ g *flowGate }

func (c saturationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descSaturation }

func (c saturationCollector) Collect(ch chan<- prometheus.Metric) {
	view := c.g.s.reg.View()
	for _, m := range view.Models {
		pool := view.Pool(m)
		if pool == nil || len(pool.Regular) == 0 {
			continue
		}
		pol, err := c.g.s.router.For(m, worker.Regular)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descSaturation, prometheus.GaugeValue, c.g.saturation(m, pool.Regular, pol), m)
	}
}

// register adds the metrics to reg.
func (m *flowMetrics) register(reg *prometheus.Registry, g *flowGate) {
	reg.MustRegister(m.queue, m.wait, m.sheds, m.canceled, saturationCollector{g})
}
