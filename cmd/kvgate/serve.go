package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/worker"
)

// serveOptions is everything `kvgate serve` is told by flags and the config file.
type serveOptions struct {
	host, logLevel  string
	configFile      string
	port, promPort  int
	logJSON         bool
	workerURLs      listFlag
	prefillURLs     listFlag
	decodeURLs      listFlag
	workerLabels    listFlag
	policyName      string
	prefillPolicy   string
	decodePolicy    string
	simWorkers      int
	shutdownGrace   time.Duration
	loadMon         loadmon.Config
	loadMonMode     string
	loadMonDisabled bool
	gw              gateway.Config
	pol             policy.Config
	sec             securityOptions
	disc            discoveryOptions
	kv              kvEventOptions
	sync            replicaSyncOptions
	memHeadroom     int64 // --memory-limit-headroom (memlimit.go)
}

// listFlag collects URLs given space- or comma-separated, over one or more uses of the flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		*l = append(*l, f)
	}
	return nil
}

// multiValueFlags take every following non-flag argument, as the reference gateway's do.
var multiValueFlags = map[string]bool{"worker-urls": true, "prefill": true, "decode": true,
	"selector": true, "prefill-selector": true, "decode-selector": true}

// joinMultiValues rewrites "--worker-urls a b c" as "--worker-urls=a,b,c".
func joinMultiValues(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		if !strings.HasPrefix(args[i], "-") || strings.Contains(name, "=") || !multiValueFlags[name] {
			out = append(out, args[i])
			continue
		}
		var vals []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			vals = append(vals, args[i])
		}
		out = append(out, "--"+name+"="+strings.Join(vals, ","))
	}
	return out
}

func newServeFlags(o *serveOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	*o = serveOptions{gw: gateway.DefaultConfig(), pol: policy.DefaultConfig(), loadMon: loadmon.DefaultConfig()}
	g, p, ca := &o.gw, &o.pol, &o.pol.CacheAware
	fs.StringVar(&o.host, "host", "0.0.0.0", "address to listen on")
	fs.IntVar(&o.port, "port", 30000, "API port")
	fs.IntVar(&o.promPort, "prometheus-port", 29000, "Prometheus /metrics port (0 = off)")
	fs.Var(&o.workerURLs, "worker-urls", "worker base URLs, space- or comma-separated (none: start built-in simulated workers)")
	fs.Var(&o.prefillURLs, "prefill", "prefill worker URLs for disaggregated serving, each URL[@BOOTSTRAP_PORT]")
	fs.Var(&o.decodeURLs, "decode", "decode worker URLs for disaggregated serving")
	fs.Var(&o.workerLabels, "worker-label", "a label for one configured worker, KEY=VALUE@URL (repeatable); health_check_*, health_*_threshold and cb_* labels override those knobs for it")
	fs.StringVar(&o.policyName, "policy", "cache_aware_hash", "routing policy: "+strings.Join(policy.Names(), ", "))
	fs.StringVar(&o.prefillPolicy, "prefill-policy", "", "policy among prefill workers (default: --policy)")
	fs.StringVar(&o.decodePolicy, "decode-policy", "", "policy among decode workers (default: --policy)")
	fs.IntVar(&o.simWorkers, "sim-workers", 4, "built-in simulated workers started when no workers are given")
	fs.StringVar(&o.configFile, "config", "", "YAML file with the same keys as these flags (flags override it)")
	fs.Int64Var(&g.MaxPayloadSize, "max-payload-size", g.MaxPayloadSize, "largest request body in bytes")
	hostileFlags(fs, g)
	memoryFlags(fs, &o.memHeadroom)
	fs.DurationVar(&g.Proxy.RequestTimeout, "request-timeout", g.Proxy.RequestTimeout, "bound on one request, retries included")
	fs.DurationVar(&g.Proxy.AttemptTimeout, "attempt-timeout", 0, "bound on one attempt up to the response headers (0 = request-timeout only)")
	fs.DurationVar(&g.Proxy.StreamIdleTimeout, "stream-idle-timeout", g.Proxy.StreamIdleTimeout, "end a streamed answer on which the worker sent nothing for this long, with an SSE error event (0 = off)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.logJSON, "log-json", false, "log JSON lines instead of text")
	fs.Int64Var(&g.MaxConcurrentRequests, "max-concurrent-requests", 0, "requests in flight above which clients get 429 (0 = no cap)")
	fs.IntVar(&g.RoutingPrefixBytes, "routing-prefix-bytes", g.RoutingPrefixBytes, "bytes of the prompt that routing sees; past an opening the prefix tree holds all of them for on several workers, that many past the opening (4 × at most)")
	fs.BoolVar(&g.FixedRoutingText, "routing-prefix-fixed", g.FixedRoutingText, "routing sees the first --routing-prefix-bytes of the prompt even where the prefix tree holds all of them for several workers")
	fs.IntVar(&g.Proxy.Retry.MaxAttempts, "retry-max-attempts", g.Proxy.Retry.MaxAttempts, "attempts per request in all (1 = no retries)")
	fs.DurationVar(&g.Proxy.Retry.InitialBackoff, "retry-initial-backoff", g.Proxy.Retry.InitialBackoff, "wait before the first retry")
	fs.DurationVar(&g.Proxy.Retry.MaxBackoff, "retry-max-backoff", g.Proxy.Retry.MaxBackoff, "longest wait between attempts")
	fs.Float64Var(&g.Proxy.Retry.Multiplier, "retry-backoff-multiplier", g.Proxy.Retry.Multiplier, "backoff growth per attempt")
	fs.Var(&g.Proxy.Retry.On, "retry-on", "failed outcomes retried on another worker: connect, 429, 503, 5xx, timeout, reset, or none (the default retries only where the engine cannot have started work)")
	fs.Float64Var(&g.Proxy.Retry.Jitter, "retry-jitter", g.Proxy.Retry.Jitter, "± fraction of jitter on each wait, below 1 (negative = none)")
	fs.IntVar(&g.Breaker.FailureThreshold, "cb-failure-threshold", g.Breaker.FailureThreshold, "consecutive failures that open a worker's circuit")
	fs.IntVar(&g.Breaker.SuccessThreshold, "cb-success-threshold", g.Breaker.SuccessThreshold, "half-open successes that close it")
	fs.DurationVar(&g.Breaker.OpenTimeout, "cb-timeout", g.Breaker.OpenTimeout, "how long a circuit stays open before probing")
	fs.BoolVar(&g.Breaker.Disabled, "disable-circuit-breaker", false, "turn circuit breakers off")
	fs.IntVar(&g.Breaker.HalfOpenProbes, "cb-half-open-probes", g.Breaker.HalfOpenProbes, "requests a half-open circuit admits at once")
	fs.Float64Var(&g.Breaker.FailureRateThreshold, "cb-failure-rate-threshold", g.Breaker.FailureRateThreshold, "also open a circuit when this share of the last --cb-failure-rate-window outcomes failed (0 = off)")
	fs.IntVar(&g.Breaker.FailureRateWindow, "cb-failure-rate-window", g.Breaker.FailureRateWindow, "outcomes --cb-failure-rate-threshold looks at")
	fs.StringVar(&g.Health.Path, "health-check-path", g.Health.Path, "route each worker's health is checked on (GET, 2xx = healthy)")
	fs.DurationVar(&g.Health.Interval, "health-check-interval", g.Health.Interval, "time between two health checks of a worker")
	fs.DurationVar(&g.Health.Timeout, "health-check-timeout", g.Health.Timeout, "bound on one health check")
	fs.IntVar(&g.Health.SuccessThreshold, "health-success-threshold", g.Health.SuccessThreshold, "consecutive passed checks that make a worker ready")
	fs.IntVar(&g.Health.FailureThreshold, "health-failure-threshold", g.Health.FailureThreshold, "consecutive failed checks that make a worker not ready")
	fs.BoolVar(&g.Health.Disabled, "disable-health-check", false, "turn active health checks off (workers are taken as ready)")
	fs.Float64Var(&ca.CacheThreshold, "cache-threshold", ca.CacheThreshold, "cache_aware: match ratio above which affinity wins")
	fs.Int64Var(&ca.BalanceAbsThreshold, "balance-abs-threshold", ca.BalanceAbsThreshold, "cache_aware: imbalanced if max-min load exceeds this...")
	fs.Float64Var(&ca.BalanceRelThreshold, "balance-rel-threshold", ca.BalanceRelThreshold, "...and max > this × min")
	fs.Float64Var(&ca.OverloadTokenUsageThreshold, "overload-token-usage-threshold", ca.OverloadTokenUsageThreshold, "cache_aware: imbalanced when a worker's KV usage exceeds this (1 = off)")
	fs.Float64Var(&ca.BalanceTokenUsageThreshold, "balance-token-usage-threshold", ca.BalanceTokenUsageThreshold, "cache_aware: imbalanced when max-min KV usage exceeds this (1 = off)")
	fs.DurationVar(&ca.EvictionInterval, "eviction-interval", ca.EvictionInterval, "cache_aware: how often prefix trees are trimmed")
	fs.IntVar(&ca.MaxTreeSize, "max-tree-size", ca.MaxTreeSize, "cache_aware: characters kept per worker per model")
	fs.Int64Var(&ca.TreeBudget, "tree-budget", ca.TreeBudget, "cache_aware: characters kept by all prefix trees together, every model and worker (0 = no gateway-wide bound)")
	costFlags(fs, &p.Cost, "")
	fs.IntVar(&p.PrefixHash.PrefixChars, "prefix-chars", p.PrefixHash.PrefixChars, "prefix_hash: leading characters hashed")
	fs.Float64Var(&p.PrefixHash.LoadFactor, "prefix-hash-load-factor", p.PrefixHash.LoadFactor, "prefix_hash: load over mean at which a key moves on")
	fs.BoolVar(&p.Sticky.Enabled, "sticky-sessions", false, "keep each session (its key: x-kvgate-routing-key, a --session-headers header, the body's prompt_cache_key or conversation, x-user-id, the body's user) on one worker until it saturates, around any policy")
	fs.DurationVar(&p.Sticky.TTL, "sticky-session-ttl", p.Sticky.TTL, "sticky sessions: how long a silent session stays bound")
	fs.IntVar(&p.Sticky.MaxSessions, "sticky-max-sessions", p.Sticky.MaxSessions, "sticky sessions: sessions kept per model (least recently used dropped past it)")
	fs.StringVar(&p.Sticky.Placement, "sticky-placement", policy.PlaceHash, "sticky sessions: where a new session goes: hash (rendezvous order of its key; replicas agree) or policy (the routing policy's choice)")
	fs.Float64Var(&p.Sticky.QueueRatio, "sticky-queue-ratio", p.Sticky.QueueRatio, "sticky sessions: a worker whose engine queues more than this share of its running batch is saturated")
	fs.Float64Var(&g.AccessLogSample, "access-log-sample", 0, "share of requests, 0 to 1, logged as one \"access\" line each (request id, model, worker, branch, status, TTFT, duration, tokens); 5xx answers always are")
	fs.BoolVar(&g.AuditHeaders, "audit-headers", false, "add x-kvgate-worker (opaque), x-kvgate-route and x-kvgate-predicted-hit (tenths) to the responses of requests that carry the admin key or a key named in --audit-headers-clients")
	fs.Var((*listFlag)(&g.AuditHeadersClients), "audit-headers-clients", "names of data-plane keys (--api-key NAME=SECRET) whose requests get the audit headers (none = only requests carrying the admin key)")
	fs.Var(secretFlag{&g.AuditIDKey}, "audit-id-key", "key (16 bytes or more) of the HMAC that makes x-kvgate-worker opaque; the same on every replica for ids that agree (also $KVGATE_AUDIT_ID_KEY; none = random per process)")
	fs.IntVar(&g.Responses.MaxEntries, "responses-affinity-entries", 65536, "/v1/responses: response ids remembered with the worker that answered them, so a follow-up turn (previous_response_id) goes back to it; least recently used dropped past it (negative = off)")
	fs.DurationVar(&g.Responses.TTL, "responses-affinity-ttl", time.Hour, "/v1/responses: how long after its answer a response id is remembered")
	fs.DurationVar(&o.loadMon.Interval, "load-monitor-interval", o.loadMon.Interval, "how often workers are polled for their load")
	fs.DurationVar(&o.loadMon.Timeout, "load-monitor-timeout", 0, "bound on one load poll (0 = min(500ms, interval/2))")
	fs.StringVar(&o.loadMonMode, "load-mode", "scaled", "load the policies see: effective, scaled, local, snapshot or max")
	fs.BoolVar(&o.loadMonDisabled, "disable-load-monitor", false, "route on this gateway's in-flight counts only")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace-period", 30*time.Second, "how long in-flight requests may finish after SIGTERM")
	addSecurityFlags(fs, o)
	addWarmFlags(fs, &g.Warm)
	addFlowFlags(fs, &g.Flow)
	addAPIFlags(fs, g)
	addDiscoveryFlags(fs, &o.disc)
	registerKVEventFlags(fs, &o.kv)
	registerReplicaSyncFlags(fs, &o.sync)
	addLoraPDFlags(fs, g)
	return fs
}

// parseServe parses args over the config file named by --config.
func parseServe(args []string, stderr io.Writer) (*serveOptions, error) {
	o := &serveOptions{}
	fs := newServeFlags(o, stderr)
	args = joinMultiValues(args)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.configFile != "" {
		if err := applyConfigFile(fs, o.configFile); err != nil {
			return nil, err
		}
	}
	if err := resolveSecurity(o); err != nil {
		return nil, err
	}
	mode, err := loadmon.ParseMode(o.loadMonMode)
	if err != nil {
		return nil, err
	}
	o.loadMon.Mode = mode
	if err := o.loadMon.Validate(); err != nil {
		return nil, err
	}
	if err := o.pol.Validate(); err != nil {
		return nil, err
	}
	// The queue judges each engine with the cost's estimate constants: one prefill rate, one
	// bytes-to-tokens rule.
	o.gw.Flow.Saturation.Estimate = o.pol.Cost.Estimate()
	if err := o.kv.validate(); err != nil {
		return nil, err
	}
	if _, err := o.sync.options(); err != nil {
		return nil, err
	}
	if s := o.gw.AccessLogSample; s < 0 || s > 1 {
		return nil, fmt.Errorf("--access-log-sample %v: want a share from 0 to 1", s)
	}
	o.policyName = o.kv.defaultPolicy(fs, o.policyName)
	if err := o.gw.Health.Validate(); err != nil {
		return nil, err
	}
	if err := o.gw.Breaker.Validate(); err != nil {
		return nil, err
	}
	for _, n := range []*string{&o.policyName, &o.prefillPolicy, &o.decodePolicy} {
		if *n != "" {
			c, err := policy.Canonical(*n)
			if err != nil {
				return nil, err
			}
			*n = c // logged and labelled by its canonical name, whatever alias was typed
		}
	}
	return o, nil
}

func newLogger(o *serveOptions, stderr io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if o.logJSON {
		return slog.New(slog.NewJSONHandler(stderr, opts)), nil
	}
	return slog.New(slog.NewTextHandler(stderr, opts)), nil
}

// runServe runs the gateway until ctx ends, then drains for the grace period.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	o.gw.Logger = log
	// net/http's Transport logs to the standard logger, quoting what a worker sent on an idle
	// connection: through proxy.StdLog that reaches the gateway's log without the bytes.
	stdlog.SetFlags(0)
	stdlog.SetOutput(proxy.StdLog(log))
	setMemoryLimit(o.gw.BodyBudget.Bytes, o.memHeadroom, log)
	return serve(ctx, o, log, nil)
}

// listenAddrs are the addresses serve listens on ("" for a plane that is off).
type listenAddrs struct{ api, metrics, admin string }

// serve wires the registry, load monitor, policies and gateway and runs the HTTP servers. ready,
// when not nil, receives the addresses once all listen.
func serve(ctx context.Context, o *serveOptions, log *slog.Logger, ready chan<- listenAddrs) error {
	reg := worker.NewRegistry()
	var mon *loadmon.Monitor
	var loads gateway.LoadSource
	if !o.loadMonDisabled {
		o.loadMon.Logger = log
		mon = loadmon.New(reg, o.loadMon)
		o.pol.Loads, loads = mon, mon
	}
	kv, stopKV, err := startKVEvents(&o.kv, reg, log)
	if err != nil {
		return err
	}
	defer stopKV()
	o.pol.KV = kv
	plane, err := startReplicaSync(ctx, &o.sync, log)
	if err != nil {
		return err
	}
	if plane != nil {
		defer plane.Close()
		o.pol.Peers, o.gw.Sync = plane.Node(), plane.Node()
	}
	router, err := policy.NewRouter(o.policyName, o.pol)
	if err != nil {
		return err
	}
	defer router.Close()
	stopTracing, err := startTracing(ctx, &o.gw, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	gw := gateway.New(o.gw, reg, router, loads)
	if err := registerBuildInfo(gw.Metrics().Registry(), ownBuild()); err != nil {
		return err
	}
	registerKVEventMetrics(gw, kv)
	if plane != nil {
		gw.Metrics().Registry().MustRegister(replicasync.NewCollector(plane.Node()))
	}

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		wg.Wait()
		if mon != nil {
			mon.Stop() // after the registration goroutines, which may start it, have exited
		}
	}()
	gw.Start(bg) // health checks follow the registry from here on
	defer gw.Stop()
	if mon != nil {
		// Polling starts once any load-aware policy exists: the router says so when it builds one.
		mon.StartOnNeed(bg)
	}

	if o.disc.enabled {
		stop, err := startDiscovery(ctx, &o.disc, gw, log)
		if err != nil {
			return err
		}
		defer stop()
	} else if len(o.workerURLs)+len(o.prefillURLs)+len(o.decodeURLs) == 0 {
		fleet, err := sim.StartFleet(bg, o.simWorkers, "127.0.0.1", 0, sim.Config{})
		if err != nil {
			return fmt.Errorf("starting built-in simulated workers: %w", err)
		}
		defer fleet.Close()
		o.workerURLs = fleet.URLs()
		log.Warn("no workers given: serving on built-in SIMULATED workers (kvgate sim engines, model "+sim.DefaultModel+"); pass --worker-urls to route to real servers",
			"count", len(o.workerURLs), "urls", strings.Join(o.workerURLs, ","))
	}
	// The gateway refuses to register itself: tell it where it is about to listen (listen tells
	// it the real addresses once the listeners are open).
	gw.ListeningOn(net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if o.sec.adminPort > 0 {
		gw.ListeningOn(net.JoinHostPort(o.sec.adminHost, strconv.Itoa(o.sec.adminPort)))
	}
	if o.promPort > 0 {
		gw.ListeningOn(net.JoinHostPort(o.host, strconv.Itoa(o.promPort)))
	}
	regs, err := registrations(o)
	if err != nil {
		return err
	}
	// Each configured worker gets one registration attempt before the gateway listens, so that
	// it serves at once; an unreachable one keeps being retried in the background.
	var first sync.WaitGroup
	for _, a := range regs {
		wg.Add(1)
		first.Add(1)
		go func() { defer wg.Done(); gw.RegisterUntilDone(bg, a, first.Done) }()
	}
	first.Wait()
	return listenAndServe(ctx, o, gw, log, ready)
}

// registrations turns the worker flags into admin-API registrations.
func registrations(o *serveOptions) ([]gateway.AddWorkerRequest, error) {
	var out []gateway.AddWorkerRequest
	for _, u := range o.workerURLs {
		out = append(out, gateway.AddWorkerRequest{URL: u})
	}
	for _, u := range o.prefillURLs {
		a := gateway.AddWorkerRequest{URL: u, WorkerType: "prefill", Labels: policyLabel(o.prefillPolicy)}
		if i := strings.LastIndex(u, "@"); i > 0 {
			port, err := strconv.Atoi(u[i+1:])
			if err != nil {
				return nil, fmt.Errorf("--prefill %q: bad bootstrap port", u)
			}
			a.URL, a.BootstrapPort = u[:i], &port
		}
		out = append(out, a)
	}
	for _, u := range o.decodeURLs {
		out = append(out, gateway.AddWorkerRequest{URL: u, WorkerType: "decode", Labels: policyLabel(o.decodePolicy)})
	}
	for _, a := range out {
		if _, err := worker.ParseURL(a.URL); err != nil {
			return nil, err
		}
	}
	for i := range out {
		out[i].APIKey = o.sec.workerAPIKey
	}
	if err := applyWorkerLabels(out, o.workerLabels); err != nil {
		return nil, err
	}
	return out, nil
}

func policyLabel(name string) map[string]string {
	if name == "" {
		return nil
	}
	return map[string]string{policy.PolicyLabel: name}
}

// listenAndServe runs the API and metrics servers until ctx ends, then shuts them down: new
// connections are refused and in-flight requests get the grace period to finish.
func listenAndServe(ctx context.Context, o *serveOptions, gw *gateway.Server, log *slog.Logger, ready chan<- listenAddrs) error {
	// Requests run under base, so that when the grace period ends they can be ended with
	// ErrShuttingDown as the cause: clients then get a clear error, not a cut connection.
	base, endRequests := context.WithCancelCause(context.Background())
	defer endRequests(nil)
	var (
		servers   []*http.Server
		listeners []net.Listener
	)
	listen := func(host string, port int, h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return "", err
		}
		srv := &http.Server{Handler: h, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			BaseContext: func(net.Listener) context.Context { return base }}
		gw.ConfigureServer(srv)
		gw.ListeningOn(ln.Addr().String())
		servers, listeners = append(servers, srv), append(listeners, ln)
		return ln.Addr().String(), nil
	}
	var addrs listenAddrs
	var err error
	if addrs.api, err = listen(o.host, o.port, gw.Handler()); err != nil {
		return err
	}
	if o.sec.adminPort >= 0 {
		if addrs.admin, err = listen(o.sec.adminHost, o.sec.adminPort, gw.AdminHandler()); err != nil {
			return fmt.Errorf("admin plane: %w", err)
		}
	}
	if o.promPort > 0 || (o.promPort == 0 && ready != nil) {
		if addrs.metrics, err = listen(o.host, o.promPort, gw.MetricsHandler()); err != nil {
			return err
		}
	}
	logPlanes(log, o, addrs.api, addrs.admin, addrs.metrics)
	log.Info("kvgate serving", "api", "http://"+addrs.api, "policy", o.policyName, "version", ownBuild().version)
	errc := make(chan error, len(servers))
	for i := range servers {
		go func() { errc <- servers[i].Serve(listeners[i]) }()
	}
	if ready != nil {
		ready <- addrs
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: refusing new requests, letting in-flight ones finish", "grace", o.shutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			errs = append(errs, err)
			// The grace period is over: end what is left with a clear error (its workers see
			// the cancel), give that a moment to be written, then cut anything still open.
			endRequests(proxy.ErrShuttingDown)
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if s.Shutdown(fctx) != nil {
				_ = s.Close()
			}
			cancel()
		}
	}
	for range servers {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		log.Warn("shutdown grace period ended with requests still in flight", "err", errors.Join(errs...))
	}
	return nil
}
