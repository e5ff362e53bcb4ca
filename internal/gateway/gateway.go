// Package gateway is kvgate's HTTP surface: the OpenAI-compatible routes, the worker admin API,
// health and readiness, authentication and limits, and the Prometheus metrics. It parses each body
// once, picks a worker through the model's policy, and hands the request to the proxy.
package gateway

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
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
	// Sync is the replica sync plane this replica shares its answers' ends and its
	// conversations' bindings over (replicasync.go); nil shares nothing.
	Sync ReplicaSync `yaml:"-"`
	// APIKeys are the data-plane keys: a client must send one of them as "Authorization: Bearer
	// KEY" (401 otherwise). Empty: the data plane needs no key. A key written "NAME=SECRET"
	// names its tenant for flow control, "NAME+priority=SECRET" also lets it set priorities
	// (auth.go, apiKey).
	APIKeys []string
	// AdminKey, when set, is required on the admin routes (/workers, /get_loads). Empty: the
	// admin routes need no key, which is safe only where AdminHandler listens on loopback.
	AdminKey string
	// AdminOnDataPlane also serves the admin routes from Handler (the main port). New refuses it
	// without an AdminKey.
	AdminOnDataPlane bool
	// AllowedWorkerHosts limits which workers may be registered: CIDRs (10.0.0.0/8) and host
	// names (exact, or ".example.com" for any name under it). Empty: any host.
	AllowedWorkerHosts []string
	// CORSAllowedOrigins are the browser origins allowed to call the data plane ("*": any).
	// Empty: no CORS headers are sent and preflights are refused.
	CORSAllowedOrigins []string
	// Limits bounds what one client request may cost.
	Limits Limits
	// MaxPayloadSize is the largest request body in bytes, after decompression (413 above).
	// Default DefaultMaxPayloadSize (32 MiB).
	MaxPayloadSize int64
	// BodyBudget bounds the request bodies held in memory, all together (bodybudget.go).
	BodyBudget BodyBudget
	// RoutingPrefixBytes is how much of the routing text policies see. Default 8192. Where the
	// policy's prefix tree holds all of it for two or more workers (an opening many prompts
	// share), policies see RoutingPrefixBytes past that opening instead, 4 × RoutingPrefixBytes
	// at most (policy.RoutingText), unless FixedRoutingText.
	RoutingPrefixBytes int
	// FixedRoutingText keeps the routing text at its first RoutingPrefixBytes, past a shared
	// opening too. Default false.
	FixedRoutingText bool
	// Tracer, when set, traces every request (OpenTelemetry): a span per request, per routing
	// decision and per upstream attempt, with traceparent sent to the worker. nil means off, at
	// the cost of a nil check.
	Tracer *tracing.Tracer
	// AccessLogSample is the share of requests, in [0,1], that get an "access" log line; requests
	// answered 5xx always do. 0 means none (the default).
	AccessLogSample float64
	// AuditHeaders adds x-kvgate-worker, x-kvgate-route and x-kvgate-predicted-hit to the routed
	// responses of requests that carry the admin key or a key named in AuditHeadersClients
	// (auditaccess.go). Default false. Validate refuses it when no client could see them.
	AuditHeaders bool
	// AuditHeadersClients names the data-plane keys (NAME of an APIKeys entry "NAME=SECRET")
	// whose requests get the audit headers. Empty: only requests carrying the admin key.
	AuditHeadersClients []string
	// AuditIDKey keys the HMAC that makes x-kvgate-worker opaque; give every replica the same
	// one (at least 16 bytes) for ids that agree across them. Empty: a random key per process.
	AuditIDKey string
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
	// Responses bounds the memory of which worker answered each Responses API response id,
	// which routes a follow-up turn (previous_response_id) back to it (responses.go).
	Responses ResponsesConfig
	// Warm warms each regular worker that joins a pool with the pool's hot prefixes
	// (warm.go); the zero value is off.
	Warm policy.WarmConfig
	// Flow is flow control: the per-model queue, priorities, tenants and their limits
	// (flow.go); the zero value is off, and requests go to a worker on arrival.
	Flow FlowConfig
	// LoRA configures loading adapters on demand (loraload.go); the zero value is off.
	LoRA LoRAConfig
	// PDProtocol is the prefill/decode protocol of disaggregated pools whose prefill worker has
	// no pd_protocol label: PDSGLang, PDVLLM, or PDAuto ("" too: by the prefill worker's
	// runtime). See disagg_vllm.go.
	PDProtocol string
	// SessionHeaders are the request headers, after X-Kvgate-Routing-Key, whose value is a
	// request's session and affinity key (session.go, sessionKeys). Empty: DefaultSessionHeaders.
	SessionHeaders []string
	// Logger receives request and lifecycle logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxPayloadSize:     DefaultMaxPayloadSize,
		RoutingPrefixBytes: 8192,
		ProbeTimeout:       5 * time.Second,
		RegisterRetry:      500 * time.Millisecond,
		Breaker:            worker.DefaultBreakerConfig(),
		Health:             worker.DefaultHealthConfig(),
		Proxy:              proxy.Config{RequestTimeout: 600 * time.Second, Retry: proxy.DefaultRetryConfig(), StreamIdleTimeout: proxy.DefaultStreamIdleTimeout},
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
	// loraLoads bounds and deduplicates the adapter loads on demand (loraload.go).
	loraLoads *loraLoader
	client    *http.Client
	// silentWorkers are the workers whose answers report no cached tokens (answers.go).
	silentWorkers silentWorkers

	inflight  atomic.Int64
	apiKeys   keySet
	adminKeys keySet
	allowed   hostRules
	// hopID marks the requests this gateway sends, to detect a loop back to itself.
	hopID string
	// self are the addresses this gateway listens on (ListeningOn).
	self selfAddrs
	// bodies recycles request-body buffers.
	bodies bodyPool
	// checker runs the active health checks between Start and Stop.
	checker *worker.Checker
	// addMu guards adding: the check that a URL is neither registered nor being probed, and
	// the registry add. It is never held across a probe.
	addMu sync.Mutex
	// probing holds the ids of workers whose registration probe is running.
	probing map[string]bool
	// warm warms joining workers between Start and Stop.
	warm *warmer
	// responses remembers which worker answered each response id.
	responses *responseAffinity
	// sessionHeaders are Config.SessionHeaders, defaulted.
	sessionHeaders []string
	// audit says which requests get the audit headers; auditIDs makes their worker ids opaque.
	audit    auditAccess
	auditIDs auditIDs
	// flow is flow control; flowOn says whether it admits requests (else it only reports the
	// pools' saturation).
	flow   *flowGate
	flowOn bool
}

// Validate reports a configuration that would expose the admin plane without a key, or an
// allowed-worker-hosts entry that does not parse.
func (c Config) Validate() error {
	if c.AdminOnDataPlane && c.AdminKey == "" {
		return errors.New("the admin routes may be served on the main port only with an admin key")
	}
	if err := c.Warm.Validate(); err != nil {
		return err
	}
	if _, err := newAuditAccess(&c, newKeySet(c.AdminKey)); err != nil {
		return err
	}
	if err := c.Flow.Validate(); err != nil {
		return err
	}
	_, err := parseHostRules(c.AllowedWorkerHosts)
	return err
}

// New builds a gateway over reg, routing through router. loads may be nil (local load only). It
// panics on a configuration Validate rejects: call Validate first on what an operator gave.
func New(cfg Config, reg *worker.Registry, router *policy.Router, loads LoadSource) *Server {
	if err := cfg.Validate(); err != nil {
		panic("gateway: " + err.Error())
	}
	allowed, _ := parseHostRules(cfg.AllowedWorkerHosts)
	if len(cfg.SessionHeaders) == 0 {
		cfg.SessionHeaders = DefaultSessionHeaders
	}
	d := DefaultConfig()
	cfg.MaxPayloadSize = cmp.Or(max(cfg.MaxPayloadSize, 0), d.MaxPayloadSize)
	cfg.RoutingPrefixBytes = cmp.Or(max(cfg.RoutingPrefixBytes, 0), d.RoutingPrefixBytes)
	cfg.ProbeTimeout = cmp.Or(max(cfg.ProbeTimeout, 0), d.ProbeTimeout)
	cfg.RegisterRetry = cmp.Or(max(cfg.RegisterRetry, 0), d.RegisterRetry)
	cfg.Limits = cfg.Limits.withDefaults()
	s := &Server{cfg: cfg, reg: reg, router: router, loads: loads, log: cfg.Logger,
		apiKeys: newKeySet(apiKeySecrets(cfg.APIKeys)...), adminKeys: newKeySet(cfg.AdminKey), allowed: allowed,
		hopID: newHopID(), probing: map[string]bool{}, responses: newResponseAffinity(cfg.Responses, time.Now),
		sessionHeaders: cfg.SessionHeaders}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.audit, _ = newAuditAccess(&cfg, s.adminKeys) // validated above
	s.auditIDs = newAuditIDs(cfg.AuditIDKey)
	s.metrics = newMetrics(reg, router, loads)
	s.bodies.memory = newBodyBudget(cfg.BodyBudget)
	s.metrics.hostile.watchBodies(s.metrics.reg, s.bodies.memory)
	s.flow, s.flowOn = newFlowGate(s, cfg.Flow, cfg.APIKeys), cfg.Flow.Enabled
	s.flow.metrics.register(s.metrics.reg, s.flow)
	cfg.Proxy.Observer = s.metrics
	cfg.Proxy.HopID = s.hopID
	if cfg.Proxy.Logger == nil {
		cfg.Proxy.Logger = s.log
	}
	if cfg.Proxy.Transport == nil {
		t := proxy.NewTransport()
		t.MaxResponseHeaderBytes = cfg.Limits.MaxUpstreamHeaderBytes
		cfg.Proxy.Transport = t
	}
	cfg.Proxy.Transport = cfg.Tracer.Transport(cfg.Proxy.Transport) // unchanged when tracing is off
	s.fwd = proxy.New(cfg.Proxy)
	s.loraLoads = newLoraLoader(cfg.LoRA)
	s.client = &http.Client{Transport: cfg.Proxy.Transport, Timeout: cfg.ProbeTimeout, CheckRedirect: worker.CheckRedirect}
	router.OnChange(s.policyChanged)
	router.Attach(reg) // policies follow the registry: built, rebuilt and released on its events
	s.warm = newWarmer(s, cfg.Warm)
	reg.Subscribe(s.warm.onEvent) // after the router builds a joining worker's policy, before forgetting a leaving one
	reg.Subscribe(func(e worker.Event) {
		if !e.Removed {
			return
		}
		router.Forget(e.Worker.ID)
		s.metrics.forgetWorker(e.Worker.ID)
		s.flow.forgetWorker(e.Worker)
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

// MetricsHandler returns the Prometheus exposition handler.
func (s *Server) MetricsHandler() http.Handler { return s.refuseLoops(s.metrics.Handler()) }

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
