// Package worker holds what kvgate knows about each inference server ("worker"): its registration,
// its hot per-request state (in-flight and processed counts, health, drain, circuit), and the
// registry that publishes the worker set as immutable views.
//
// Per-worker hot state is atomics in one struct that must not be copied; policies read it through
// Available and Inflight without locks.
package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
)

// Type is a worker's role. The zero value is Regular.
type Type uint8

const (
	// Regular workers serve whole requests.
	Regular Type = iota
	// Prefill workers run the prefill half of a disaggregated request.
	Prefill
	// Decode workers run the decode half of a disaggregated request.
	Decode
)

// String returns the wire name of t.
func (t Type) String() string {
	switch t {
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	default:
		return "regular"
	}
}

// ParseType parses a wire worker type; "" is Regular.
func ParseType(s string) (Type, error) {
	switch strings.ToLower(s) {
	case "", "regular":
		return Regular, nil
	case "prefill":
		return Prefill, nil
	case "decode":
		return Decode, nil
	}
	return Regular, fmt.Errorf("unknown worker_type %q (want regular, prefill or decode)", s)
}

// Health is a worker's health-check state.
type Health int32

const (
	// Pending: registered, not yet confirmed healthy. Not routable.
	Pending Health = iota
	// Ready: passing health checks. Routable.
	Ready
	// NotReady: failing health checks. Not routable.
	NotReady
)

// String returns the state's name as shown in the admin API and metrics.
func (h Health) String() string {
	switch h {
	case Ready:
		return "ready"
	case NotReady:
		return "not_ready"
	default:
		return "pending"
	}
}

// Spec is a worker's registration: what the operator (flag, admin API, discovery) says about it.
// It is immutable once the worker is created.
type Spec struct {
	// URL is the worker's base URL, e.g. http://10.0.0.5:8000. Required. Once the worker is
	// created it is the URL as shown (admin API, metric labels, logs): any userinfo is
	// replaced by Redacted; Worker.URL keeps the credentials for requests.
	URL string `json:"url"`
	// Models are the model ids the worker serves; empty means "learn from /v1/models".
	Models []string `json:"models,omitempty"`
	// Parents maps each model of Models that is a LoRA adapter to its base model, as the
	// worker's /v1/models lists it ("parent"); nil when none is.
	Parents map[string]string `json:"parents,omitempty"`
	// Type is the worker's role; zero is Regular.
	Type Type `json:"-"`
	// BootstrapPort is the prefill worker's KV bootstrap port; nil when not configured.
	BootstrapPort *int `json:"bootstrap_port,omitempty"`
	// Labels are free-form; "policy" selects the model's policy.
	Labels map[string]string `json:"labels,omitempty"`
	// Runtime is "sglang", "vllm" or "" (unknown: learned from /v1/models owned_by).
	Runtime string `json:"runtime,omitempty"`
	// APIKey, when set, is sent to the worker as a bearer token.
	APIKey string `json:"-"`
	// Source names what manages the worker when that is not the operator: "kubernetes:NS/POD"
	// for a worker found by service discovery, which alone may remove it. Empty for workers from
	// flags and the admin API.
	Source string `json:"source,omitempty"`
}

// Worker is one registered inference server. Its exported fields are immutable after New; all
// mutable state is atomic. A Worker must not be copied.
type Worker struct {
	_ noCopy

	// ID is a stable identifier derived from the URL.
	ID string
	// Spec is the registration.
	Spec Spec
	// URL is the registered URL parsed, credentials included: use it to send requests, never
	// to show the worker (Spec.URL is the redacted form).
	URL *url.URL

	inflight  atomic.Int64
	awaiting  atomic.Int64
	processed atomic.Int64
	health    atomic.Int32
	draining  atomic.Bool
	warming   atomic.Bool
	// runtime is the runtime learned after registration when Spec.Runtime is empty.
	runtime atomic.Pointer[string]
	// echo is what the worker was seen to echo of a request's id (Echo bits, echo.go).
	echo atomic.Uint32
	// alive ends when the worker next fails its health checks (alive.go).
	alive atomic.Pointer[aliveCtx]
	// learned is the models learned after registration (learned.go).
	learned learnedModels

	// Breaker is the worker's circuit breaker.
	Breaker Breaker
}

// noCopy makes go vet's copylocks check flag copies of Worker.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// ParseURL validates a worker base URL: http or https, with a host, no query or fragment. A
// trailing slash is removed.
func ParseURL(raw string) (*url.URL, error) {
	// Errors never quote the URL: it may carry credentials, and errors reach logs and clients.
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("invalid worker url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("invalid worker url %s: scheme must be http or https", Redacted(u))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("invalid worker url %s: missing host", Redacted(u))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("invalid worker url %s: query and fragment are not allowed", Redacted(u))
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return u, nil
}

// IDFor returns the stable worker id for a normalized URL. Userinfo takes no part: two URLs that
// differ only in credentials name the same worker, and the id (which is shown) cannot be used to
// guess a password offline.
func IDFor(u *url.URL) string {
	c := *u
	c.User = nil
	sum := sha256.Sum256([]byte(c.String()))
	return hex.EncodeToString(sum[:6])
}

// Redacted returns u as it may be shown: userinfo (a user name can be a token too) is replaced
// by "redacted".
func Redacted(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = url.User("redacted")
	return c.String()
}

// ValidAPIKey reports whether key can be sent as a bearer token: printable ASCII only. A CR or
// LF would end the header line and let the key's owner write headers of their own into every
// request to the worker.
func ValidAPIKey(key string) error {
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("invalid api_key: byte %d is not printable ASCII", i)
		}
	}
	return nil
}

// New creates a worker in the Pending state from spec, with breaker settings bc.
func New(spec Spec, bc BreakerConfig) (*Worker, error) {
	u, err := ParseURL(spec.URL)
	if err != nil {
		return nil, err
	}
	if err := ValidAPIKey(spec.APIKey); err != nil {
		return nil, err
	}
	spec.URL = Redacted(u)
	w := &Worker{ID: IDFor(u), Spec: spec, URL: u}
	w.Breaker.init(bc)
	return w, nil
}

// Available reports whether a policy may pick w now: ready, not draining, not warming, circuit
// not open.
func (w *Worker) Available() bool {
	if Health(w.health.Load()) != Ready || w.draining.Load() || w.warming.Load() {
		return false
	}
	// Only an open or half-open circuit needs the time; a closed one (the common case) does not.
	return w.Breaker.Closed() || w.Breaker.Allows(w.Breaker.cfg.Clock())
}

// Inflight returns the number of requests this gateway has in flight to w.
func (w *Worker) Inflight() int64 { return w.inflight.Load() }

// Awaiting returns the number of this gateway's streamed requests in flight to w that have not
// yet had the first byte of their response body: those whose engine has not yet produced the
// first token (waiting for, or in, their prefill). It is part of Inflight; the proxy does not
// count a request that is not streamed (its first byte is its end).
func (w *Worker) Awaiting() int64 { return w.awaiting.Load() }

// Processed returns the number of requests this gateway has finished on w (any outcome).
func (w *Worker) Processed() int64 { return w.processed.Load() }

// Acquire counts one request in flight without the breaker: the fleet simulator's engines have no
// breaker to settle. The request path uses Begin, whose lease settles both. Call it just before
// the request is sent and call the returned release (idempotent) when it ends for any reason.
func (w *Worker) Acquire() (release func()) {
	_, release = w.Track()
	return release
}

// Track is Acquire that also counts the request as awaiting its first byte (Awaiting) until
// first or release is called, whichever comes first. Both are idempotent and safe to call from
// different goroutines.
func (w *Worker) Track() (first, release func()) {
	w.inflight.Add(1)
	w.awaiting.Add(1)
	var answered, done atomic.Bool
	first = func() {
		if answered.CompareAndSwap(false, true) {
			w.awaiting.Add(-1)
		}
	}
	return first, func() {
		if done.CompareAndSwap(false, true) {
			first()
			w.inflight.Add(-1)
			w.processed.Add(1)
		}
	}
}

// Health returns the current health state.
func (w *Worker) Health() Health { return Health(w.health.Load()) }

// SetHealth stores h and reports whether it changed.
func (w *Worker) SetHealth(h Health) (changed bool) {
	changed = Health(w.health.Swap(int32(h))) != h
	if changed && h == NotReady {
		w.failedHealth()
	}
	return changed
}

// Draining reports whether w takes no new requests.
func (w *Worker) Draining() bool { return w.draining.Load() }

// SetWarming holds w out of routing (true) while the gateway warms its cache, or returns it
// (false). Requests sent to w directly (the warm-up's own) are not affected.
func (w *Worker) SetWarming(on bool) { w.warming.Store(on) }

// Warming reports whether w is held out of routing while its cache is warmed.
func (w *Worker) Warming() bool { return w.warming.Load() }

// Drain stops new requests to w; in-flight requests finish.
func (w *Worker) Drain() { w.draining.Store(true) }

// Runtime returns the worker's runtime: the registered one, else the learned one, else "".
func (w *Worker) Runtime() string {
	if w.Spec.Runtime != "" {
		return w.Spec.Runtime
	}
	if r := w.runtime.Load(); r != nil {
		return *r
	}
	return ""
}

// SetRuntime records a runtime learned from the worker (its /v1/models owned_by).
func (w *Worker) SetRuntime(r string) { w.runtime.Store(&r) }

// Label returns the value of label k, or "".
func (w *Worker) Label(k string) string { return w.Spec.Labels[k] }
