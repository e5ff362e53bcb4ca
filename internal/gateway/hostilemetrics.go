package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// hostileMetrics count what a hostile or broken worker, or a flood of large bodies, did: answers
// that were not the answer to the request sent (strays), and request bodies held in memory.
type hostileMetrics struct {
	strays *prometheus.CounterVec
}

func newHostileMetrics(reg *prometheus.Registry) *hostileMetrics {
	h := &hostileMetrics{
		strays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_upstream_stray_answers_total",
			Help: "Worker answers that did not carry the request id of the request sent (another request's, or none from a worker that echoed it before); never relayed, the request was sent again on a new connection.",
		}, []string{"worker", "how"}),
	}
	reg.MustRegister(h.strays)
	return h
}

var _ proxy.StrayObserver = (*Metrics)(nil)

// StrayAnswer implements proxy.StrayObserver.
func (m *Metrics) StrayAnswer(w *worker.Worker, how string) {
	m.hostile.strays.WithLabelValues(w.ID, how).Inc()
}

// watchBodies exports the body memory budget: its size, what it holds, and the requests it
// refused.
func (h *hostileMetrics) watchBodies(reg *prometheus.Registry, b *bodyBudget) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_request_body_bytes_held",
			Help: "Bytes of request-body buffers held (being read, queued or in flight, retries included).",
		}, func() float64 { used, _ := b.held(); return float64(used) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvgate_request_body_budget_bytes",
			Help: "The gateway-wide budget for request-body buffers (--body-memory-budget; negative: none).",
		}, func() float64 { return float64(b.limit) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvgate_request_body_budget_refused_total",
			Help: "Requests answered 503 because the request-body memory budget had no room for their body within --body-budget-wait.",
		}, func() float64 { _, refused := b.held(); return float64(refused) }),
	)
}
