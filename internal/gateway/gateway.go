// Package gateway is kvgate's HTTP surface: the OpenAI-compatible routes, the worker admin API,
// health and readiness, authentication and limits, and the Prometheus metrics. It parses each body
// once, picks a worker through the model's policy, and hands the request to the proxy.
package gateway

import (
	"cmp"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/worker"
)

// Config configures the gateway's HTTP surface.
type Config struct {
	// APIKey, when set, is required from clients as "Authorization: Bearer KEY" (401 otherwise).
	APIKey string
	// AdminKey, when set, is required on the admin routes (/workers, /get_loads).
	AdminKey string
	// MaxPayloadSize is the largest request body in bytes (413 above). Default 256 MiB.
	MaxPayloadSize int64
	// RoutingPrefixBytes is how much of the routing text policies see. Default 8192.
	RoutingPrefixBytes int
	// Tracer, when set, traces every request (OpenTelemetry): a span per request, per routing
	// decision and per upstream attempt, with traceparent sent to the worker. nil means off, at
	// the cost of a nil check.
	Tracer *tracing.Tracer
	// AccessLogSample is the share of requests, in [0,1], that get an "access" log line; requests
	// answered 5xx always do. 0 means none (the default).
	AccessLogSample float64
	// AuditHeaders adds x-kvgate-worker, x-kvgate-route and x-kvgate-predicted-hit to every
	// routed response (audit.go says who sees them). Default false.
	AuditHeaders bool
	// MaxConcurrentRequests caps requests in flight through this gateway (429 above); 0 = no cap.
	MaxConcurrentRequests int64
	// ProbeTimeout bounds the registration probe of a worker. Default 5s.
	ProbeTimeout time.Duration
	// RegisterRetry is the first wait before RegisterUntilDone tries an unreachable worker
	// again; it doubles up to 10s. Default 500ms.
	RegisterRetry time.Duration
	// Breaker configures each worker's circuit breaker; worker labels override it per worker.
	Breaker worker.BreakerConfig
	// Health configures the active health checks that Start runs; worker labels override it per
	// worker.
	Health worker.HealthConfig
	// Proxy configures forwarding, timeouts and retries.
	Proxy proxy.Config
	// Logger receives request and lifecycle logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxPayloadSize:     256 << 20,
		RoutingPrefixBytes: 8192,
		ProbeTimeout:       5 * time.Second,
		RegisterRetry:      500 * time.Millisecond,
		Breaker:            worker.DefaultBreakerConfig(),
		Health:             worker.DefaultHealthConfig(),
		Proxy:              proxy.Config{RequestTimeout: 600 * time.Second, Retry: proxy.DefaultRetryConfig()},
	}
}

// LoadSource is the load view shown by /get_loads and the load gauges: each worker's effective
// load and last fresh report. *loadmon.Monitor implements it.
type LoadSource = policy.Loads

// Server is the gateway. Create it with New; it is safe for concurrent use.
type Server struct {
	cfg     Config
	reg     *worker.Registry
	router  *policy.Router
	fwd     *proxy.Forwarder
	metrics *Metrics
	log     *slog.Logger
	loads   LoadSource
	client  *http.Client

	inflight atomic.Int64
	// bodies recycles request-body buffers.
	bodies bodyPool
	// checker runs the active health checks between Start and Stop.
	checker *worker.Checker
	// addMu serialises registrations so duplicate checks and probes do not race.
	addMu sync.Mutex
}

// New builds a gateway over reg, routing through router. loads may be nil (local load only).
func New(cfg Config, reg *worker.Registry, router *policy.Router, loads LoadSource) *Server {
	d := DefaultConfig()
	cfg.MaxPayloadSize = cmp.Or(max(cfg.MaxPayloadSize, 0), d.MaxPayloadSize)
	cfg.RoutingPrefixBytes = cmp.Or(max(cfg.RoutingPrefixBytes, 0), d.RoutingPrefixBytes)
	cfg.ProbeTimeout = cmp.Or(max(cfg.ProbeTimeout, 0), d.ProbeTimeout)
	cfg.RegisterRetry = cmp.Or(max(cfg.RegisterRetry, 0), d.RegisterRetry)
	s := &Server{cfg: cfg, reg: reg, router: router, loads: loads, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.metrics = newMetrics(reg, router, loads)
	cfg.Proxy.Observer = s.metrics
	if cfg.Proxy.Transport == nil {
		cfg.Proxy.Transport = proxy.NewTransport()
	}
	cfg.Proxy.Transport = cfg.Tracer.Transport(cfg.Proxy.Transport) // unchanged when tracing is off
	s.fwd = proxy.New(cfg.Proxy)
	s.client = &http.Client{Transport: cfg.Proxy.Transport, Timeout: cfg.ProbeTimeout}
	router.Attach(reg) // policies follow the registry: built, rebuilt and released on its events
	reg.Subscribe(func(e worker.Event) {
		if !e.Removed {
			return
		}
		router.Forget(e.Worker.ID)
		s.metrics.forgetWorker(e.Worker.ID)
		view := reg.View()
		for _, m := range e.Worker.Spec.Models {
			if view.Pool(m) == nil {
				s.metrics.forgetModel(m)
			}
		}
	})
	s.checker = s.newChecker()
	return s
}

// Registry returns the worker registry.
func (s *Server) Registry() *worker.Registry { return s.reg }

// Metrics returns the gateway's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler returns the client-facing and admin routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for path, kind := range map[string]routeKind{
		"/v1/chat/completions": kindChat,
		"/v1/completions":      kindCompletion,
		"/v1/embeddings":       kindEmbedding,
		"/generate":            kindGenerate,
	} {
		mux.Handle("POST "+path, s.clientAuth(s.inference(path, kind)))
	}
	mux.Handle("GET /v1/models", s.clientAuth(http.HandlerFunc(s.handleModels)))
	mux.HandleFunc("GET /health", s.handleLiveness)
	mux.HandleFunc("GET /liveness", s.handleLiveness)
	mux.HandleFunc("GET /readiness", s.handleReadiness)
	mux.Handle("POST /workers", s.adminAuth(http.HandlerFunc(s.handleAddWorker)))
	mux.Handle("GET /workers", s.adminAuth(http.HandlerFunc(s.handleListWorkers)))
	mux.Handle("GET /workers/{id}", s.adminAuth(http.HandlerFunc(s.handleGetWorker)))
	mux.Handle("DELETE /workers/{id}", s.adminAuth(http.HandlerFunc(s.handleDeleteWorker)))
	mux.Handle("GET /get_loads", s.adminAuth(http.HandlerFunc(s.handleGetLoads)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// MetricsHandler returns the Prometheus exposition handler.
func (s *Server) MetricsHandler() http.Handler { return s.metrics.Handler() }

func bearer(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

func keyOK(want, got string) bool {
	return want == "" || subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

func (s *Server) clientAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !keyOK(s.cfg.APIKey, bearer(r)) {
			writeError(w, http.StatusUnauthorized, "invalid_api_key", "missing or invalid API key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) adminAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !keyOK(s.cfg.AdminKey, bearer(r)) {
			writeError(w, http.StatusUnauthorized, "invalid_admin_key", "missing or invalid admin key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requestID returns a safe client-supplied id, or a new random one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && printable(id) {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// routingKey is the session identity for consistent hashing.
func routingKey(h http.Header) string {
	for _, k := range []string{"X-Kvgate-Routing-Key", "X-Session-Id", "X-User-Id"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return ""
}
