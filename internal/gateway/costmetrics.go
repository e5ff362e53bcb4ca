package gateway

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
)

// Calibration of the cost model. A cost-based policy predicts each decision's time to first
// token (policy.Decision.Chosen.TTFT(), in seconds: the cost less the delay the prompt adds to
// the requests queued behind it); kvgate_route_predicted_ttft_seconds{worker}
// is that prediction per picked worker, and kvgate_route_ttft_error_seconds{worker} the measured
// time to the first streamed byte less the prediction, so an operator sees per worker how far the
// model is off and in which direction (a worker whose error stays positive is slower than its
// measured prefill rate says: a slow network, a tokenizer stall, a cost term the engine does not
// report). The worker label is the worker id, bounded by the registry; a removed worker's series
// go with it (forgetWorker).

// ttftErrorBuckets spans −30 s to +30 s, finer near zero.
var ttftErrorBuckets = []float64{-30, -10, -5, -2.5, -1, -.5, -.25, -.1, -.05, -.025, 0, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func costMetrics() (predicted, errs *prometheus.HistogramVec) {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_route_predicted_ttft_seconds",
			Help:    "The time to first token the cost-based policy predicted for the worker it picked.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"worker"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_route_ttft_error_seconds",
			Help:    "Measured time to the first streamed byte minus the predicted time to first token, per worker (streamed requests of cost-based policies).",
			Buckets: ttftErrorBuckets,
		}, []string{"worker"})
}

// routed observes a cost decision's prediction and, at debug level, logs its terms.
func (s *Server) routed(ctx context.Context, pol string, d *policy.Decision) {
	if !d.HasCost || d.Worker == "" {
		return
	}
	s.metrics.child(hotKey{metric: hotPredTTFT, worker: d.Worker}).observer.Observe(d.Chosen.TTFT())
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.Debug("route decision", "policy", pol, "worker", d.Worker, "branch", d.Branch,
			"chosen", d.Chosen.String(), "runner_up", d.RunnerUp.String())
	}
}

// calibrate observes the measured TTFT of a streamed request against its decision's prediction.
func (s *Server) calibrate(d *policy.Decision, res *proxy.Result, stream bool) {
	if !stream || !d.HasCost || res.FirstByte <= 0 || res.Status >= 400 || res.Worker == nil || res.Worker.ID != d.Worker {
		return
	}
	s.metrics.child(hotKey{metric: hotTTFTError, worker: d.Worker}).observer.Observe(res.FirstByte.Seconds() - d.Chosen.TTFT())
}
