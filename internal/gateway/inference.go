package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/worker"
)

// inference returns the handler for one OpenAI-style route.
func (s *Server) inference(path string, kind routeKind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var o outcome
		var tr *tracing.Request
		if s.cfg.Tracer != nil {
			var ctx context.Context
			ctx, tr = s.cfg.Tracer.StartRequest(r, path)
			r = r.WithContext(ctx)
		}
		status, model, abort := s.serveInference(w, r, path, kind, &o, tr)
		d := time.Since(start)
		s.metrics.observeRequest(path, model, status, d)
		if tr != nil {
			attempts := 0
			if o.res != nil {
				attempts = o.res.Attempts
			}
			tr.End(status, attempts)
		}
		s.logAccess(r.Context(), &o, path, model, status, d)
		if abort || status == StatusClientClosed {
			// The client has a truncated body that nothing marks as such, or closed its side
			// (a half-close ends the request as a full close does: the two cannot be told
			// apart, and the worker must stop at once when a client leaves). Cut the
			// connection, now that every counter is settled, rather than let net/http finish
			// the response: an empty 200 would be a lie.
			panic(http.ErrAbortHandler)
		}
	})
}

// serveInference handles one request and returns the status the client saw, the resolved model
// (a bounded label: "" for requests that named no served model), and whether the client's
// connection must be aborted (Result.Abort).
func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, path string, kind routeKind, o *outcome, tr *tracing.Request) (status int, model string, abort bool) {
	status, model, res := s.route(w, r, path, kind, o, tr)
	if res != nil {
		abort = res.Abort
	}
	o.res = res
	return status, model, abort
}

// route validates, routes and forwards one request, noting in o what the access log shows and in
// tr (nil: tracing off) what the trace shows; res is nil when it was answered before any
// forwarding.
func (s *Server) route(w http.ResponseWriter, r *http.Request, path string, kind routeKind, o *outcome, tr *tracing.Request) (int, string, *proxy.Result) {
	if max := s.cfg.MaxConcurrentRequests; max > 0 {
		if s.inflight.Add(1) > max {
			s.inflight.Add(-1)
			writeError(w, http.StatusTooManyRequests, "too_many_requests", fmt.Sprintf("the gateway is at its limit of %d concurrent requests", max))
			return http.StatusTooManyRequests, "", nil
		}
		defer s.inflight.Add(-1)
	}
	rb, err := s.readRequestBody(w, r)
	if err != nil {
		be := err.(*bodyError)
		if be.status != StatusClientClosed {
			writeError(w, be.status, codeFor(be.status), be.msg)
		}
		return be.status, "", nil
	}
	defer rb.Release()
	body := rb.Bytes()
	p, err := parseBody(body, rb.quotes, kind, s.cfg.RoutingPrefixBytes)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return http.StatusBadRequest, "", nil
	}
	view := s.reg.View()
	pool, status, msg := resolvePool(view, p.Model)
	if pool == nil && status == http.StatusNotFound && s.cfg.LoRA.OnDemand {
		pool, status, msg = s.loadOnDemand(r.Context(), p.Model) // loraload.go
	}
	if pool == nil {
		writeError(w, status, codeFor(status), msg)
		return status, "", nil
	}
	s.copyAdapter(pool) // loracopy.go
	candidates := pool.Regular
	if len(candidates) == 0 {
		if !pool.Disaggregated() {
			// A rollout can leave a model with prefill workers and no decode workers, or the
			// reverse: nothing can serve it until the other half arrives.
			msg := fmt.Sprintf("no available worker for model %q: %d prefill and %d decode workers, and a disaggregated request needs both", pool.Model, len(pool.Prefill), len(pool.Decode))
			writeError(w, http.StatusServiceUnavailable, "no_available_worker", msg)
			return http.StatusServiceUnavailable, pool.Model, nil
		}
		res := s.serveDisaggregated(w, r, path, body, &p, pool)
		return res.Status, pool.Model, &res
	}
	pol, err := s.router.For(pool.Model, worker.Regular)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "policy_error", err.Error())
		return http.StatusInternalServerError, pool.Model, nil
	}
	// What the request keeps while it is forwarded (each part would escape on its own), in one
	// allocation instead of three.
	rq := &routedRequest{}
	preq := &rq.policy
	*preq = policy.Request{Model: pool.Model, Text: s.routingText(pol, body, &p), Chat: kind == kindChat, Body: body, PromptBytes: len(body), Adapter: adapterOf(pool), Parent: pool.Parent, Salt: p.Salt, Salted: p.Salted}
	preq.Key, preq.Affinity = s.sessionKeys(r.Header, &p)
	id := requestID(r)
	preq.ID = id
	w.Header().Set("X-Request-Id", id)
	aw := &rq.audit
	var ids *auditIDs
	if s.audit.allows(r) {
		ids = &s.auditIDs
	}
	*aw = newAuditWriter(w, preq, p.TextBytes, pol.Name(), ids)
	aw.observer, _ = policy.As[policy.CacheObserver](pol)
	o.id, o.policy, o.decision = id, pol.Name(), &preq.Decision
	tr.SetRequest(id, pool.Model)
	// What the policy needs from elsewhere (precise_prefix: the prompt's tokens) is fetched
	// here, under the request's context: admission prices the request on it, and no pick does
	// I/O.
	policy.Prepare(r.Context(), pol, candidates, preq)
	if s.flowOn {
		fr := &rq.flow
		*fr = flowRequest{model: pool.Model, candidates: candidates, pol: pol, preq: preq, body: rb, bytes: int64(len(body)), hasBodyPri: p.HasPriority, bodyPri: p.Priority}
		if f := s.flow.admit(r, fr, &rq.ticket); f != nil {
			writeRefusal(w, f, id)
			return f.status, pool.Model, nil
		}
		defer rq.ticket.done()
		body = rb.Bytes() // a queued request's body moved (Body.shrink)
		preq.Body = body
	}
	rq.forward = proxy.Request{
		Path: upstreamPath(path, r), Header: r.Header, Body: body, BodyRef: rb, RequestID: id, ClientIP: clientIP(r), Stream: p.Stream,
	}
	if fb, ref := s.learnFrom(aw, pol, kind, p.Stream, body); !ref {
		rq.forward.Body, rq.forward.BodyRef = fb, nil // answers.go: the stream is asked for usage
	}
	var res proxy.Result
	if kind == kindResponses {
		res = s.forwardResponses(r.Context(), aw, &rq.forward, s.picker(r.Context(), pol, candidates, preq, tr, &rq.ticket), candidates, &p, preq, pol.Name(), tr)
	} else {
		res = s.fwd.Forward(r.Context(), aw, &rq.forward, s.picker(r.Context(), pol, candidates, preq, tr, &rq.ticket))
	}
	s.finish(w, r, res, pool.Model, p.Stream, id)
	s.finishedOn(pool.Model, res.Worker, id)
	s.calibrate(&preq.Decision, &res, p.Stream)
	if s.cfg.AccessLogSample > 0 {
		o.usage, o.hasUsage = aw.usage() // before finish recycles what it kept
	}
	aw.finish(s.metrics, pool.Model, res.Err == nil)
	return res.Status, pool.Model, &res
}

// routedRequest is what route keeps of a request while it is forwarded: the policy's view of
// it, the writer that audits the answer, what the proxy forwards, and its flow control.
type routedRequest struct {
	policy  policy.Request
	audit   auditWriter
	forward proxy.Request
	flow    flowRequest
	ticket  flowTicket
}

// upstreamPath is the worker path for route with the client's query string.
func upstreamPath(route string, r *http.Request) string {
	if r.URL.RawQuery == "" {
		return route
	}
	return route + "?" + r.URL.RawQuery
}

// picker adapts a policy to the proxy's retry loop: the first attempt sees every candidate (with
// the queue on, every one that can start the request, while any can); a retry sees those not
// yet tried while any of them is available, else all again. The first pick ends the request's
// flow-control hold t (the worker's in-flight count takes it over).
func (s *Server) picker(ctx context.Context, pol policy.Policy, candidates []*worker.Worker, req *policy.Request, tr *tracing.Request, t *flowTicket) proxy.Picker {
	return func(tried []*worker.Worker) *worker.Worker {
		// The request's own filters (tried, cannot start) are policy.Choose's first.
		req.Tried, req.Startable = tried, nil
		w := t.choose(len(tried) == 0, req, func() *worker.Worker { return policy.Choose(ctx, pol, candidates, req) })
		if w != nil {
			s.metrics.selected(pol.Name(), req.Model, w)
			s.routed(ctx, pol.Name(), &req.Decision)
		}
		if tr != nil {
			d := &req.Decision
			tr.Decision(len(tried)+1, pol.Name(), d.Worker, d.Branch, d.Predicted, d.HasPrediction)
		}
		return w
	}
}

// finish writes the error for a request that never reached the client, and records metrics.
func (s *Server) finish(w http.ResponseWriter, r *http.Request, res proxy.Result, model string, stream bool, id string) {
	if stream && res.FirstByte > 0 && res.Status < 400 {
		s.metrics.child(hotKey{metric: hotTTFT, model: model}).observer.Observe(res.FirstByte.Seconds())
	}
	if res.Err == nil {
		return
	}
	wid := ""
	if res.Worker != nil {
		wid = res.Worker.ID
	}
	if res.Committed || res.Status == StatusClientClosed {
		s.log.Debug("request failed", "request_id", id, "model", model, "worker", wid,
			"status", res.Status, "attempts", res.Attempts, "committed", res.Committed, "err", res.Err)
		return
	}
	// The client learns what happened and the request id; the worker's address and the Go
	// error go to the log only.
	s.log.Warn("request failed", "request_id", id, "model", model, "worker", wid,
		"status", res.Status, "attempts", res.Attempts, "err", res.Err)
	var e *proxy.Error
	if !errors.As(res.Err, &e) {
		writeError(w, res.Status, codeFor(res.Status), "the request failed (request id "+id+")")
		return
	}
	msg, code := failureMessage(e), codeFor(res.Status)
	switch e.Kind {
	case proxy.KindNoWorker:
		msg = s.unavailableMessage(model, e)
	case proxy.KindShutdown:
		code = "shutting_down"
	}
	writeError(w, res.Status, code, msg+" (request id "+id+")")
}

// resolvePool finds the pool for model: the named one, or the only one when the body names none.
func resolvePool(v *worker.View, model string) (*worker.Pool, int, string) {
	if len(v.Models) == 0 {
		return nil, http.StatusServiceUnavailable, "no workers are registered"
	}
	if model == "" {
		if len(v.Models) == 1 {
			return v.Pool(v.Models[0]), 0, ""
		}
		return nil, http.StatusBadRequest, fmt.Sprintf("the request must name a model: this gateway serves %d models", len(v.Models))
	}
	if p := v.Pool(model); p != nil {
		return p, 0, ""
	}
	return nil, http.StatusNotFound, fmt.Sprintf("the model %q does not exist", model)
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// codeFor is the machine-readable error code for a gateway-generated status.
func codeFor(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request"
	case http.StatusNotFound:
		return "model_not_found"
	case http.StatusRequestEntityTooLarge:
		return "payload_too_large"
	case http.StatusTooManyRequests:
		return "too_many_requests"
	case http.StatusBadGateway:
		return "upstream_error"
	case http.StatusServiceUnavailable:
		return "no_available_worker"
	case http.StatusGatewayTimeout:
		return "upstream_timeout"
	case http.StatusRequestTimeout:
		return "request_timeout"
	case http.StatusUnsupportedMediaType:
		return "unsupported_media_type"
	case http.StatusLoopDetected:
		return "loop_detected"
	}
	return "error"
}
