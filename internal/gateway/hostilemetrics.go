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
