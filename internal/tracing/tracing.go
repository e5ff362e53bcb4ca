// Package tracing is kvgate's OpenTelemetry tracing: the OTLP exporter set up from the standard
// OTEL_* environment variables, and the spans the gateway makes — one per client request, one per
// routing decision, one per upstream attempt — with the W3C traceparent carried to the worker.
//
// Tracing is off unless an OTLP endpoint is configured. Off, the gateway holds a nil *Tracer and
// every hook is one nil check: no span, no allocation, no header.
package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether the environment asks for trace export: an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and neither
// OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none turns it off.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns a Tracer exporting over OTLP/HTTP as the OTEL_* environment variables say
// (endpoint, headers, timeout, compression, TLS; sampler through OTEL_TRACES_SAMPLER; resource
// through OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES), and its shutdown, which flushes. It
// returns nil, nil, nil when Enabled is false. Only the http/protobuf protocol is built in; asking
// for grpc is an error rather than a silent fallback.
func Setup(ctx context.Context) (*Tracer, func(context.Context) error, error) {
	if !Enabled() {
		return nil, nil, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nil, nil, fmt.Errorf("tracing: OTLP protocol %q is not supported (use http/protobuf, port 4318)", proto)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName("kvgate")), resource.Default())
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return New(tp), tp.Shutdown, nil
}

// Tracer makes kvgate's spans. A nil *Tracer is valid and does nothing.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracer over tp, propagating W3C trace context (traceparent, tracestate) and
// baggage.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		tracer: tp.Tracer("github.com/kvgate/kvgate"),
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// Request is the trace state of one client request. A nil *Request is valid and does nothing.
type Request struct {
	t    *Tracer
	ctx  context.Context // carries span
	span trace.Span

	mu sync.Mutex
	// attempt describes the last routing decision, for the upstream attempt that follows it.
	attempt int
	worker  string
	branch  string
	share   float64
	hasPred bool
}

type requestKey struct{}

// StartRequest starts the span of a client request, continuing the client's trace when its
// headers carry one, and returns the context to forward with.
func (t *Tracer) StartRequest(r *http.Request, route string) (context.Context, *Request) {
	if t == nil {
		return r.Context(), nil
	}
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := t.tracer.Start(ctx, "kvgate.request "+route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(route)))
	req := &Request{t: t, span: span}
	req.ctx = context.WithValue(ctx, requestKey{}, req)
	return req.ctx, req
}

// SetRequest records the gateway's request id and the resolved model.
func (r *Request) SetRequest(id, model string) {
	if r != nil {
		r.span.SetAttributes(attribute.String("kvgate.request_id", id), attribute.String("gen_ai.request.model", model))
	}
}

// Decision records one routing decision as its own short span, and keeps it for the upstream
// attempt it leads to: the attempt number (1 for the first), the policy, the worker id, the
// policy's branch and its predicted cached share of the prompt (when it made one).
func (r *Request) Decision(attempt int, policy, worker, branch string, share float64, hasPred bool) {
	if r == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int("kvgate.attempt", attempt), attribute.String("kvgate.policy", policy),
		attribute.String("kvgate.worker", worker), attribute.String("kvgate.branch", branch),
	}
	if hasPred {
		attrs = append(attrs, attribute.Float64("kvgate.predicted_prefix_share", share))
	}
	_, span := r.t.tracer.Start(r.ctx, "kvgate.route", trace.WithAttributes(attrs...))
	if worker == "" {
		span.SetStatus(codes.Error, "no worker available")
	}
	span.End()
	r.mu.Lock()
	r.attempt, r.worker, r.branch, r.share, r.hasPred = attempt, worker, branch, share, hasPred
	r.mu.Unlock()
}

// End ends the request span with the status the client saw and the attempts made.
func (r *Request) End(status, attempts int) {
	if r == nil {
		return
	}
	r.span.SetAttributes(semconv.HTTPResponseStatusCode(status), attribute.Int("kvgate.attempts", attempts),
		attribute.Int("kvgate.retries", max(attempts-1, 0)))
	if status >= 500 {
		r.span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	r.span.End()
}

// Transport wraps base so that every upstream request made under a traced client request gets
// its own client span, whose context reaches the worker as traceparent. Requests outside one
// (health checks, load polls, registration probes) pass through untouched.
func (t *Tracer) Transport(base http.RoundTripper) http.RoundTripper {
	if t == nil {
		return base
	}
	return &transport{t: t, base: base}
}

type transport struct {
	t    *Tracer
	base http.RoundTripper
}

// Unwrap returns the transport that sends the requests, so that a caller can tell what it
// wraps.
func (tr *transport) Unwrap() http.RoundTripper { return tr.base }

// CloseIdleConnections closes the idle connections of the transport it wraps, so that a gateway
// that stops holds no idle sockets to workers with tracing on either.
func (tr *transport) CloseIdleConnections() {
	if c, ok := tr.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r, _ := req.Context().Value(requestKey{}).(*Request)
	if r == nil {
		return tr.base.RoundTrip(req)
	}
	r.mu.Lock()
	attrs := []attribute.KeyValue{
		attribute.Int("kvgate.attempt", r.attempt), attribute.String("kvgate.worker", r.worker),
		attribute.String("kvgate.branch", r.branch), attribute.Bool("kvgate.retry", r.attempt > 1),
		semconv.ServerAddress(req.URL.Hostname()), semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.URLPath(req.URL.Path),
	}
	if r.hasPred {
		attrs = append(attrs, attribute.Float64("kvgate.predicted_prefix_share", r.share))
	}
	r.mu.Unlock()
	if p, err := strconv.Atoi(req.URL.Port()); err == nil {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	ctx, span := tr.t.tracer.Start(req.Context(), "kvgate.upstream", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	req = req.Clone(ctx)
	tr.t.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := tr.base.RoundTrip(req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "upstream request failed")
		span.End()
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// spanBody ends the attempt's span when the relayed body is closed: a streamed answer's span
// lasts as long as the stream.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.span.End() })
	return err
}
