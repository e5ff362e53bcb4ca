package gateway

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// Stored responses: GET /v1/responses/{id} (with ?stream=true, its events again), DELETE
// /v1/responses/{id}, GET /v1/responses/{id}/input_items and POST /v1/responses/{id}/cancel
// act on a response that one worker holds in its memory (vLLM and SGLang keep stored responses
// per server), so each goes to the worker the response-affinity table names for the id
// (responses.go), and nowhere else: no other worker has it, and no policy is asked. An id the
// table does not hold (never answered through this gateway, forgotten past its bound or TTL,
// deleted) is answered 404 in the OpenAI shape without reaching any worker, as is a malformed
// one; so is an id whose worker has left the pool (its memory went with it). A worker that is
// there but not available (not ready, circuit open, draining) is answered 503: the response
// may come back with it. The worker's own answer is relayed, and a DELETE it accepts, or a 404
// it gives, drops the id from the table. The query (input_items' after, limit, order; GET's
// stream, starting_after, include) is forwarded as the client sent it; no body is.
//
// Who may: any data-plane client (the client keys guard these routes as every inference route);
// a client that knows another's response id reaches it here as it could by previous_response_id
// — the worker decides, as the ids are the engine's, drawn at random.

// storedResponseRoutes registers the stored-response routes on mux.
func (s *Server) storedResponseRoutes(mux *http.ServeMux) {
	for _, rt := range []struct{ method, suffix string }{
		{http.MethodGet, ""}, {http.MethodDelete, ""},
		{http.MethodGet, "/input_items"}, {http.MethodPost, "/cancel"},
	} {
		pattern := "/v1/responses/{id}" + rt.suffix
		mux.Handle(rt.method+" "+pattern, s.clientAuth(s.storedResponse(rt.method, pattern, rt.suffix)))
	}
}

// storedResponse returns the handler of one stored-response route; route is its pattern, the
// metrics' path label.
func (s *Server) storedResponse(method, route, suffix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		status := s.serveStoredResponse(w, r, method, suffix)
		s.metrics.observeRequest(route, "", status, time.Since(start))
	})
}

// serveStoredResponse answers one stored-response request and returns the status the client saw.
func (s *Server) serveStoredResponse(w http.ResponseWriter, r *http.Request, method, suffix string) int {
	id := r.PathValue("id")
	reqID := requestID(r)
	w.Header().Set("X-Request-Id", reqID)
	notFound := func() int {
		writeError(w, http.StatusNotFound, "response_not_found", fmt.Sprintf("Response with id '%s' not found.", validResponseID(id)))
		return http.StatusNotFound
	}
	if validResponseID(id) == "" {
		return notFound()
	}
	wid, ok := s.responses.lookup(id)
	if !ok {
		return notFound()
	}
	wk := s.reg.View().Get(wid)
	if wk == nil {
		s.responses.forget(id)
		return notFound()
	}
	if !wk.Available() {
		writeError(w, http.StatusServiceUnavailable, "no_available_worker", "the worker that holds this response is not available now (request id "+reqID+")")
		return http.StatusServiceUnavailable
	}
	path := "/v1/responses/" + url.PathEscape(id) + suffix
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	fr := proxy.Request{Method: method, Path: path, Header: r.Header, RequestID: reqID, ClientIP: clientIP(r),
		Stream: method == http.MethodGet && suffix == "" && r.URL.Query().Get("stream") == "true"}
	res := s.fwd.Forward(r.Context(), w, &fr, func(tried []*worker.Worker) *worker.Worker {
		if len(tried) == 0 {
			return wk
		}
		return nil // no other worker holds it
	})
	if res.Err == nil && (res.Status == http.StatusNotFound || method == http.MethodDelete && res.Status < 300) {
		s.responses.forget(id)
	}
	s.finish(w, r, res, "", fr.Stream, reqID)
	if res.Abort {
		panic(http.ErrAbortHandler)
	}
	return res.Status
}

// responseStore is what the stored-response routes and the Responses route need of the table of
// which worker holds each response id: remember, lookup, forget. responseAffinity is the
// replica's own; a table shared between replicas implements the same three.
type responseStore interface {
	remember(id, workerID string)
	lookup(id string) (workerID string, ok bool)
	forget(id string)
}

var _ responseStore = (*responseAffinity)(nil)
