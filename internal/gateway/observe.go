package gateway

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
)

// outcome is what one routed request came to, gathered for the access log. The zero value is a
// request answered before routing (bad body, unknown model, limit).
type outcome struct {
	id       string
	policy   string
	res      *proxy.Result
	decision *policy.Decision
	// usage is what the worker reported, read when the access log is on.
	usage    auditUsage
	hasUsage bool
}

// logAccess writes the request's access-log line when it is sampled (Config.AccessLogSample)
// or failed on the gateway's or a worker's side (status 5xx), which is always logged.
func (s *Server) logAccess(ctx context.Context, o *outcome, route, model string, status int, d time.Duration) {
	rate := s.cfg.AccessLogSample
	if rate <= 0 && status < 500 {
		return
	}
	if status < 500 && rate < 1 && rand.Float64() >= rate {
		return
	}
	attrs := make([]slog.Attr, 0, 14)
	attrs = append(attrs, slog.String("request_id", o.id), slog.String("route", route), slog.String("model", model),
		slog.Int("status", status), slog.Float64("duration_ms", ms(d)))
	if res := o.res; res != nil {
		if res.Worker != nil {
			attrs = append(attrs, slog.String("worker", res.Worker.ID))
		}
		attrs = append(attrs, slog.Int("attempts", res.Attempts))
		if res.FirstByte > 0 {
			attrs = append(attrs, slog.Float64("ttft_ms", ms(res.FirstByte)))
		}
	}
	if o.policy != "" {
		attrs = append(attrs, slog.String("policy", o.policy))
	}
	if dec := o.decision; dec != nil {
		if dec.Branch != "" {
			attrs = append(attrs, slog.String("branch", dec.Branch))
		}
		if dec.HasPrediction {
			attrs = append(attrs, slog.Float64("predicted_prefix_share", dec.Predicted))
		}
	}
	if u := o.usage; o.hasUsage {
		attrs = append(attrs, slog.Int("prompt_tokens", u.PromptTokens))
		if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
			attrs = append(attrs, slog.Int("cached_tokens", *u.PromptTokensDetails.CachedTokens))
		}
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "access", attrs...)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
