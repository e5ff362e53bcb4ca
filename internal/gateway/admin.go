package gateway

import (
	"github.com/kvgate/kvgate/internal/netaddr"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// AddWorkerRequest is the body of POST /workers (the SGLang gateway's worker API).
type AddWorkerRequest struct {
	URL           string            `json:"url"`
	ModelID       string            `json:"model_id,omitempty"`
	WorkerType    string            `json:"worker_type,omitempty"`
	BootstrapPort *int              `json:"bootstrap_port,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Runtime       string            `json:"runtime,omitempty"`
	APIKey        string            `json:"api_key,omitempty"`
	// Source is set by service discovery (never from JSON): see worker.Spec.Source.
	Source string `json:"-"`
}

// RegisterError is a registration failure with the status the admin API answers.
type RegisterError struct {
	Status int
	// Code is the error code the admin API answers; "" means the status's usual one.
	Code string
	Err  error
}

func (e *RegisterError) Error() string { return e.Err.Error() }
func (e *RegisterError) Unwrap() error { return e.Err }

func regErr(status int, format string, args ...any) error {
	return &RegisterError{Status: status, Err: fmt.Errorf(format, args...)}
}

// selfErr refuses a worker URL that leads back to this gateway (self.go).
func selfErr(format string, args ...any) error {
	return &RegisterError{Status: http.StatusConflict, Code: "worker_is_this_gateway", Err: fmt.Errorf(format, args...)}
}

// spec validates a registration and turns it into a worker spec.
func (a *AddWorkerRequest) spec() (worker.Spec, error) {
	if _, err := worker.ParseURL(a.URL); err != nil {
		return worker.Spec{}, regErr(http.StatusBadRequest, "%v", err)
	}
	t, err := worker.ParseType(a.WorkerType)
	if err != nil {
		return worker.Spec{}, regErr(http.StatusBadRequest, "%v", err)
	}
	switch a.Runtime = strings.ToLower(a.Runtime); a.Runtime {
	case "", "sglang", "vllm":
	default:
		return worker.Spec{}, regErr(http.StatusBadRequest, "unknown runtime %q (want sglang or vllm)", a.Runtime)
	}
	if a.BootstrapPort != nil && (*a.BootstrapPort <= 0 || *a.BootstrapPort > 65535) {
		return worker.Spec{}, regErr(http.StatusBadRequest, "bootstrap_port %d is not a port", *a.BootstrapPort)
	}
	if err := checkLabels(a.Labels); err != nil {
		return worker.Spec{}, regErr(http.StatusBadRequest, "%v", err)
	}
	if l := a.Labels[policy.PolicyLabel]; l != "" {
		if _, err := policy.Canonical(l); err != nil {
			return worker.Spec{}, regErr(http.StatusBadRequest, "label policy: %v", err)
		}
	}
	spec := worker.Spec{URL: a.URL, Type: t, BootstrapPort: a.BootstrapPort, Labels: a.Labels, Runtime: a.Runtime, APIKey: a.APIKey, Source: a.Source}
	if a.ModelID != "" {
		spec.Models = []string{a.ModelID}
	}
	return spec, nil
}

// Register validates, probes and adds a worker. The probe (GET /v1/models) learns the worker's
// models (unless model_id was given) and its runtime (from owned_by). A worker that cannot be
// probed is refused (502) unless model_id was given, in which case it is added not ready and the
// health checks decide when it serves. The probe runs without holding the registration lock, so
// a worker that never answers delays only its own registration; a second registration of a URL
// being probed is refused (409). Why a probe failed is logged, never returned: the answer must
// not make the gateway a port scanner or a reader of other hosts' pages.
func (s *Server) Register(ctx context.Context, a AddWorkerRequest) (*worker.Worker, error) {
	spec, err := a.spec()
	if err != nil {
		return nil, err
	}
	u, _ := worker.ParseURL(spec.URL)
	if h := netaddr.Parse(u.Hostname()); h.IP.IsValid() && h.IP.Zone() == "" && h.String() != u.Hostname() {
		// An address in a legacy spelling (10.1, 0x0a000001) is dialed as the address the checks
		// below read, never handed to a resolver that could read it as a name.
		if p := u.Port(); p != "" {
			u.Host = h.String() + ":" + p
		} else {
			u.Host = h.String()
		}
		spec.URL = u.String()
	}
	if !s.allowed.allows(u.Hostname()) {
		return nil, regErr(http.StatusForbidden, "workers at %s may not be registered (see --allowed-worker-hosts)", u.Hostname())
	}
	id, shown := worker.IDFor(u), worker.Redacted(u)
	if s.pointsAtSelf(ctx, u) {
		return nil, selfErr("%s is one of this gateway's own listeners: a gateway cannot be its own worker", shown)
	}
	if err := s.startProbe(id, shown); err != nil {
		return nil, err
	}
	defer s.endProbe(id)
	models, parents, owner, perr := s.probeModels(ctx, u.String(), spec.APIKey)
	if errors.Is(perr, errSelf) {
		return nil, selfErr("%s answers as this gateway itself (its hop id came back): a gateway cannot be its own worker", shown)
	}
	if perr != nil {
		s.log.Warn("worker registration probe failed", "url", shown, "err", perr)
		if len(spec.Models) == 0 {
			return nil, regErr(http.StatusBadGateway, "the worker at %s did not answer GET /v1/models with a model list; see the gateway log, or give model_id", shown)
		}
	}
	if len(spec.Models) == 0 {
		spec.Models = models
	}
	if len(spec.Models) == 0 {
		return nil, regErr(http.StatusBadGateway, "worker %s lists no models; give model_id", shown)
	}
	spec.Parents = adapterParents(spec.Models, parents)
	w, err := s.newWorker(spec)
	if err != nil {
		return nil, err
	}
	if owner == "vllm" || owner == "sglang" {
		w.SetRuntime(owner)
	}
	if perr == nil {
		w.SetHealth(worker.Ready)
	} else {
		w.SetHealth(worker.NotReady)
	}
	s.addMu.Lock()
	err = s.reg.Add(w)
	s.addMu.Unlock()
	if err != nil {
		return nil, regErr(http.StatusConflict, "%v", err)
	}
	s.log.Info("worker registered", "worker", w.ID, "url", w.Spec.URL, "models", w.Spec.Models,
		"type", w.Spec.Type.String(), "runtime", w.Runtime(), "health", w.Health().String())
	s.warnLabelNotApplied(w)
	return w, nil
}

// startProbe claims the right to probe and add worker id: it fails when the worker is registered
// or another registration of it is under way.
func (s *Server) startProbe(id, shown string) error {
	s.addMu.Lock()
	defer s.addMu.Unlock()
	if s.reg.View().Get(id) != nil {
		return regErr(http.StatusConflict, "worker %s is already registered", shown)
	}
	if s.probing[id] {
		return regErr(http.StatusConflict, "worker %s is being registered already", shown)
	}
	s.probing[id] = true
	return nil
}

func (s *Server) endProbe(id string) {
	s.addMu.Lock()
	delete(s.probing, id)
	s.addMu.Unlock()
}

// probeModels fetches the worker's /v1/models and returns the ids, the parent of each LoRA
// adapter (lora.go), and the first owned_by.
func (s *Server) probeModels(ctx context.Context, base, key string) ([]string, map[string]string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, nil, "", err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set(HopHeader, s.hopID) // so that this gateway, if that is who answers, says so
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, "", err
	}
	defer resp.Body.Close()
	if s.answeredBySelf(resp) {
		return nil, nil, "", errSelf
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, "", fmt.Errorf("GET /v1/models answered %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID      string  `json:"id"`
			OwnedBy string  `json:"owned_by"`
			Parent  *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return nil, nil, "", fmt.Errorf("GET /v1/models: %w", err)
	}
	var ids []string
	var parents map[string]string
	owner := ""
	for _, m := range list.Data {
		if m.ID != "" {
			ids = append(ids, m.ID)
			parents = withParent(parents, m.ID, m.Parent)
		}
		if owner == "" {
			owner = strings.ToLower(m.OwnedBy)
		}
	}
	return ids, parents, owner, nil
}

// WorkerInfo is a worker as the admin API shows it.
type WorkerInfo struct {
	ID            string            `json:"id"`
	URL           string            `json:"url"`
	Models        []string          `json:"model_ids"`
	WorkerType    string            `json:"worker_type"`
	BootstrapPort *int              `json:"bootstrap_port"`
	Labels        map[string]string `json:"labels,omitempty"`
	Runtime       string            `json:"runtime,omitempty"`
	Source        string            `json:"source,omitempty"`
	Health        string            `json:"health"`
	Circuit       string            `json:"circuit"`
	Draining      bool              `json:"draining"`
	Warming       bool              `json:"warming,omitempty"` // held out of routing while its cache is warmed
	Inflight      int64             `json:"inflight"`
	Processed     int64             `json:"processed"`
	// AuditID is the worker as the audit headers name it (x-kvgate-worker), shown while they
	// are on.
	AuditID string `json:"audit_id,omitempty"`
}

// info is w as the admin API shows it.
func (s *Server) info(w *worker.Worker) WorkerInfo {
	i := infoOf(w)
	if s.audit.on {
		i.AuditID = s.auditIDs.of(w.ID)
	}
	return i
}

func infoOf(w *worker.Worker) WorkerInfo {
	return WorkerInfo{
		ID: w.ID, URL: w.Spec.URL, Models: w.Spec.Models, WorkerType: w.Spec.Type.String(),
		BootstrapPort: w.Spec.BootstrapPort, Labels: w.Spec.Labels, Runtime: w.Runtime(), Source: w.Spec.Source,
		Health: w.Health().String(), Circuit: w.Breaker.State(time.Now()).String(),
		Draining: w.Draining(), Warming: w.Warming(), Inflight: w.Inflight(), Processed: w.Processed(),
	}
}

// Bounds on a registration's labels: they are shown by the admin API and kept per worker.
const (
	maxLabels        = 64
	maxLabelKeyLen   = 64
	maxLabelValueLen = 256
)

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return fmt.Errorf("at most %d labels are allowed", maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKeyLen || !printable(k) {
			return fmt.Errorf("label keys must be 1 to %d printable ASCII bytes", maxLabelKeyLen)
		}
		if len(v) > maxLabelValueLen || !utf8.ValidString(v) {
			return fmt.Errorf("label %s: values must be valid UTF-8 of at most %d bytes", k, maxLabelValueLen)
		}
	}
	return checkConnReuseLabel(labels)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) handleAddWorker(w http.ResponseWriter, r *http.Request) {
	var a AddWorkerRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "invalid worker registration: "+err.Error())
		return
	}
	wk, err := s.Register(r.Context(), a)
	if err != nil {
		status, code := http.StatusInternalServerError, ""
		var re *RegisterError
		if errors.As(err, &re) {
			status, code = re.Status, re.Code
		}
		if code == "" {
			code = registerCode(status)
		}
		writeError(w, status, code, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, s.info(wk))
}

func registerCode(status int) string {
	switch status {
	case http.StatusConflict:
		return "worker_exists"
	case http.StatusBadGateway:
		return "worker_unreachable"
	case http.StatusForbidden:
		return "worker_host_not_allowed"
	}
	return codeFor(status)
}

func (s *Server) handleListWorkers(w http.ResponseWriter, _ *http.Request) {
	all := s.reg.View().All
	out := make([]WorkerInfo, 0, len(all))
	for _, wk := range all {
		out = append(out, s.info(wk))
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": out, "total": len(out)})
}

func (s *Server) handleGetWorker(w http.ResponseWriter, r *http.Request) {
	wk := s.reg.View().Get(r.PathValue("id"))
	if wk == nil {
		writeError(w, http.StatusNotFound, "worker_not_found", fmt.Sprintf("no worker with id %q", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, s.info(wk))
}

// handleDeleteWorker drains and unregisters a worker: no new requests reach it at once, and the
// requests already on it finish.
//
// A worker that service discovery manages is refused (409): it leaves when its pod stops being
// ready, and removing it by hand would only last until the next pod event.
func (s *Server) handleDeleteWorker(w http.ResponseWriter, r *http.Request) {
	if wk := s.reg.View().Get(r.PathValue("id")); wk != nil && wk.Spec.Source != "" {
		writeError(w, http.StatusConflict, "worker_managed", fmt.Sprintf(
			"worker %s is managed by %s; it is removed when its pod stops being ready or is deleted", wk.ID, wk.Spec.Source))
		return
	}
	wk, err := s.reg.Remove(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, "worker_not_found", err.Error())
		return
	}
	s.log.Info("worker removed", "worker", wk.ID, "url", wk.Spec.URL, "inflight", wk.Inflight())
	writeJSON(w, http.StatusOK, map[string]any{"id": wk.ID, "status": "draining", "inflight": wk.Inflight()})
}

// model is one entry of /v1/models.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func modelObject(id string) model { return model{ID: id, Object: "model", OwnedBy: "kvgate"} }

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	v := s.reg.View()
	data := make([]model, 0, len(v.Models))
	for _, m := range v.Models {
		data = append(data, modelObject(m))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleLiveness(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadiness answers 200 whenever the gateway can answer requests, whatever its workers'
// state: a pool with no ready worker is for the gateway to explain (each request gets the 503
// JSON naming why), not a reason for a load balancer to stop sending it clients, who would then
// get connection errors instead. The body says how many workers are ready ("workers_ready");
// GET /readiness/workers is the probe that fails (503) while none is.
func (s *Server) handleReadiness(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.workerReadiness("ready"))
}

// handleWorkersReadiness answers 200 while at least one worker is routable, else 503 with the
// reason: for alerts and for a deployment that wants the old coupling of gateway and workers.
func (s *Server) handleWorkersReadiness(w http.ResponseWriter, _ *http.Request) {
	body := s.workerReadiness("ready")
	if !body.WorkersReady {
		body.Status = "not_ready"
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// readiness is the body of the readiness probes.
type readiness struct {
	// Status is "ready" or "not_ready": the probe's answer.
	Status string `json:"status"`
	// WorkersReady is true while at least one worker is routable.
	WorkersReady bool `json:"workers_ready"`
	ReadyWorkers int  `json:"ready_workers"`
	TotalWorkers int  `json:"total_workers"`
	// Reason says why no worker is ready; empty while one is.
	Reason string `json:"reason,omitempty"`
}

func (s *Server) workerReadiness(status string) readiness {
	all := s.reg.View().All
	r := readiness{Status: status, TotalWorkers: len(all)}
	for _, wk := range all {
		if wk.Available() {
			r.ReadyWorkers++
		}
	}
	r.WorkersReady = r.ReadyWorkers > 0
	switch {
	case len(all) == 0:
		r.Reason = "no workers are registered"
	case r.ReadyWorkers == 0:
		r.Reason = "no worker is ready"
	}
	return r
}

// handleGetLoads shows, per worker, its last load report with its age and freshness, why its
// last poll failed (if it did), this gateway's in-flight count, and the effective load the
// policies use. Without a load monitor it shows local in-flight counts only.
func (s *Server) handleGetLoads(w http.ResponseWriter, _ *http.Request) {
	if wl, ok := s.loads.(interface{ WorkerLoads() []loadmon.WorkerLoad }); ok {
		s.writeLoads(w, true, wl.WorkerLoads())
		return
	}
	all := s.reg.View().All
	out := make([]loadmon.WorkerLoad, 0, len(all))
	for _, wk := range all {
		out = append(out, loadmon.WorkerLoad{ID: wk.ID, URL: wk.Spec.URL, Local: wk.Inflight(), Effective: wk.Inflight()})
	}
	s.writeLoads(w, false, out)
}

// RegisterUntilDone registers a configured worker, retrying while it cannot be reached (it may
// still be starting: a probe that fails is a 502) with a backoff from Config.RegisterRetry,
// doubling up to 10s, until ctx ends. tried, when not nil, is called once: after the first
// attempt that did not have to wait (success or a definite refusal), or when the first attempt
// found the worker unreachable, so that a caller can wait for one attempt per worker before it
// serves. Other failures (a bad registration, a duplicate) are logged and not retried.
func (s *Server) RegisterUntilDone(ctx context.Context, a AddWorkerRequest, tried func()) {
	if tried == nil {
		tried = func() {}
	}
	tried = sync.OnceFunc(tried)
	defer tried()
	backoff := s.cfg.RegisterRetry
	for warned := false; ; {
		_, err := s.Register(ctx, a)
		var re *RegisterError
		if err == nil || !errors.As(err, &re) || re.Status != http.StatusBadGateway {
			if err != nil {
				s.log.Error("worker not registered", "url", shownURL(a.URL), "err", err)
			}
			return
		}
		if !warned {
			s.log.Warn("worker unreachable; retrying until it answers", "url", shownURL(a.URL), "err", err)
			warned = true
			tried()
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// shownURL is a registration's URL as it may be logged: without credentials.
func shownURL(raw string) string {
	u, err := worker.ParseURL(raw)
	if err != nil {
		return "(invalid url)"
	}
	return worker.Redacted(u)
}
