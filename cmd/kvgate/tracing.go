package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/tracing"
)

// startTracing turns OpenTelemetry tracing on when the OTEL_EXPORTER_OTLP_* environment asks for
// it, setting cfg.Tracer; the returned stop flushes the spans still buffered.
func startTracing(ctx context.Context, cfg *gateway.Config, log *slog.Logger) (stop func(), err error) {
	t, shutdown, err := tracing.Setup(ctx)
	if err != nil || t == nil {
		return func() {}, err
	}
	cfg.Tracer = t
	log.Info("tracing: exporting spans over OTLP as the OTEL_* environment says")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("tracing: flushing spans failed", "err", err)
		}
	}, nil
}
