package gateway

import (
	"fmt"
	"net/http"
	"strings"
)

// Handler returns the data plane: the OpenAI-compatible routes, /v1/models, and the liveness and
// readiness probes. With AdminOnDataPlane it serves the admin routes too (behind the admin key).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for path, kind := range map[string]routeKind{
		"/v1/chat/completions": kindChat,
		"/v1/completions":      kindCompletion,
		"/v1/embeddings":       kindEmbedding,
		"/generate":            kindGenerate,
		"/v1/responses":        kindResponses,
	} {
		mux.Handle("POST "+path, s.clientAuth(s.inference(path, kind)))
	}
	s.messagesRoutes(mux)
	s.storedResponseRoutes(mux)
	mux.Handle("GET /v1/models", s.clientAuth(http.HandlerFunc(s.handleModels)))
	mux.Handle("GET /v1/models/{id}", s.clientAuth(http.HandlerFunc(s.handleModel)))
	s.probeRoutes(mux)
	if s.cfg.AdminOnDataPlane {
		s.adminRoutes(mux)
	}
	return s.refuseLoops(s.withCORS(withFallback(mux)))
}

// AdminHandler returns the admin plane: the worker admin API and /get_loads, behind the admin key
// when one is set, plus the liveness probe.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	s.adminRoutes(mux)
	mux.HandleFunc("GET /health", s.handleLiveness)
	return s.refuseLoops(withFallback(mux))
}

func (s *Server) probeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", s.handleLiveness)
	mux.HandleFunc("GET /liveness", s.handleLiveness)
	mux.HandleFunc("GET /readiness", s.handleReadiness)
	mux.HandleFunc("GET /readiness/workers", s.handleWorkersReadiness)
}

func (s *Server) adminRoutes(mux *http.ServeMux) {
	mux.Handle("POST /workers", s.adminAuth(requireJSON(http.HandlerFunc(s.handleAddWorker))))
	mux.Handle("GET /workers", s.adminAuth(http.HandlerFunc(s.handleListWorkers)))
	mux.Handle("GET /workers/{id}", s.adminAuth(http.HandlerFunc(s.handleGetWorker)))
	mux.Handle("DELETE /workers/{id}", s.adminAuth(http.HandlerFunc(s.handleDeleteWorker)))
	mux.Handle("GET /get_loads", s.adminAuth(http.HandlerFunc(s.handleGetLoads)))
}

// withFallback answers what mux has no route for in the OpenAI error shape: 405 with Allow when
// the path exists under other methods, else 404.
func withFallback(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			if r.RequestURI == "*" || strings.Contains(pattern, "{") {
				// The mux answers "*" itself and sets a wildcard's path values on r.
				mux.ServeHTTP(w, r)
				return
			}
			// What mux.ServeHTTP would do, without looking the route up a second time.
			r.Pattern = pattern
			h.ServeHTTP(w, r)
			return
		}
		// The mux's own answer for an unmatched request is 404, or 405 with Allow: learn
		// which, without letting its plain-text body through.
		probe := &statusProbe{header: http.Header{}}
		h.ServeHTTP(probe, r)
		path := r.URL.Path
		if len(path) > 128 {
			path = path[:128] + "…"
		}
		if probe.status == http.StatusMethodNotAllowed {
			allow := probe.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, path, allow))
			return
		}
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, path))
	})
}

// statusProbe records a handler's status and headers and drops its body.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }
func (p *statusProbe) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}
func (p *statusProbe) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return len(b), nil
}

// handleModel answers GET /v1/models/{id}, which the OpenAI SDKs call to retrieve one model.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range s.reg.View().Models {
		if m == id {
			writeJSON(w, http.StatusOK, modelObject(m))
			return
		}
	}
	writeError(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("the model %q does not exist", strings.ToValidUTF8(id, "")))
}
