package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// Start runs the gateway's background work, the active health checks and the warm-ups of
// joining workers (warm.go), until ctx ends or Stop is called.
func (s *Server) Start(ctx context.Context) {
	s.checker.Start(ctx)
	s.warm.start(ctx)
	if s.flowOn {
		s.flow.start(ctx)
	}
}

// Stop ends what Start began and waits for it to exit, then closes the idle connections to
// workers (in-flight ones are the requests', which end them). It is idempotent.
func (s *Server) Stop() {
	s.flow.stop()
	s.warm.stop()
	s.checker.Stop()
	s.waitLoraLoads() // loracopy.go
	s.client.CloseIdleConnections()
}

// newChecker builds the health checker, reporting transitions to the metrics.
func (s *Server) newChecker() *worker.Checker {
	return worker.NewChecker(s.reg, s.cfg.Health, worker.CheckerOptions{
		Logger: s.log,
		OnTransition: func(w *worker.Worker, _, to worker.Health) {
			s.metrics.healthTo.WithLabelValues(w.ID, to.String()).Inc()
			s.flow.dispatchAll() // a worker that became ready may take queued requests
		},
	})
}

// newWorker creates a worker from a validated spec with the gateway's breaker settings overridden
// by its labels, and hooks its breaker to the log and the metrics.
func (s *Server) newWorker(spec worker.Spec) (*worker.Worker, error) {
	bc, err := s.cfg.Breaker.WithLabels(spec.Labels)
	if err != nil {
		return nil, regErr(http.StatusBadRequest, "%v", err)
	}
	if _, err := s.cfg.Health.WithLabels(spec.Labels); err != nil {
		return nil, regErr(http.StatusBadRequest, "%v", err)
	}
	if _, err := ParsePDProtocol(spec.Labels[PDProtocolLabel]); err != nil {
		return nil, regErr(http.StatusBadRequest, "label %s: %v", PDProtocolLabel, err)
	}
	w, err := worker.New(spec, bc)
	if err != nil {
		return nil, regErr(http.StatusBadRequest, "%v", err)
	}
	id, url := w.ID, w.Spec.URL
	w.Breaker.OnChange(func(from, to worker.CircuitState) {
		lvl := slog.LevelInfo
		if to == worker.Open {
			lvl = slog.LevelWarn
		}
		s.log.Log(context.Background(), lvl, "worker circuit changed", "worker", id, "url", url,
			"from", from.String(), "to", to.String())
		s.metrics.circuitTo.WithLabelValues(id, to.String()).Inc()
	})
	return w, nil
}

// unavailableMessage explains a 503: how many of the model's workers exist and why none could
// take the request, and the last upstream error when there was one.
func (s *Server) unavailableMessage(model string, e *proxy.Error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "no available worker for model %q", model)
	pool := s.reg.View().Pool(model)
	if pool == nil {
		return b.String()
	}
	var notReady, draining, open, avail int
	all := append(append(append([]*worker.Worker(nil), pool.Regular...), pool.Prefill...), pool.Decode...)
	now := time.Now()
	for _, w := range all {
		switch {
		case w.Draining():
			draining++
		case w.Health() != worker.Ready:
			notReady++
		case !w.Breaker.Allows(now):
			open++
		default:
			avail++
		}
	}
	fmt.Fprintf(&b, ": %d workers, %d not ready, %d circuit open, %d draining", len(all), notReady, open, draining)
	if avail > 0 {
		fmt.Fprintf(&b, ", %d unreachable", avail)
	}
	if e.Last != nil {
		fmt.Fprintf(&b, " (last attempt: %s)", failureMessage(e.Last))
	}
	return b.String()
}

// forgetWorker drops a removed worker's series.
func (m *Metrics) forgetWorker(id string) {
	l := prometheus.Labels{"worker": id}
	m.forgetHot(func() {
		m.healthTo.DeletePartialMatch(l)
		m.circuitTo.DeletePartialMatch(l)
		m.selections.DeletePartialMatch(l)
		m.upstream.DeletePartialMatch(l)
		m.predictedTTFT.DeletePartialMatch(l)
		m.ttftError.DeletePartialMatch(l)
	}, func(k hotKey) bool { return k.worker == id })
}

// forgetModel drops the series of a model that no worker serves any more, so that a gateway that
// has served many models over its life keeps series only for the current ones.
func (m *Metrics) forgetModel(model string) {
	l := prometheus.Labels{"model": model}
	m.forgetHot(func() {
		for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
			m.requests, m.duration, m.ttft, m.selections, m.predictionError, m.predictionMissing,
		} {
			v.DeletePartialMatch(l)
		}
	}, func(k hotKey) bool { return k.model == model })
}

// failureMessage tells a client why forwarding failed, from the classified error alone: never a
// worker's address or a Go error string (the log has those).
func failureMessage(e *proxy.Error) string {
	switch e.Kind {
	case proxy.KindConnect:
		return "the worker could not be connected to"
	case proxy.KindTimeout:
		return "the worker did not answer in time"
	case proxy.KindStreamIdle:
		return "the worker's stream went silent"
	case proxy.KindCanceled:
		return "the client closed the request"
	case proxy.KindShutdown:
		return "the gateway is shutting down; retry the request"
	case proxy.KindNoWorker:
		return "no worker is available"
	case proxy.KindStatus:
		return fmt.Sprintf("the worker answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	case proxy.KindStreamBroken:
		return "the worker's answer broke off"
	}
	return "the worker's connection failed"
}
