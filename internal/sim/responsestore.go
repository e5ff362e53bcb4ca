package sim

import (
	"net/http"
)

// Stored responses, as vLLM serves them: GET /v1/responses/{id} answers the response object a
// POST /v1/responses gave (with "store" not false), DELETE /v1/responses/{id} forgets it and
// answers {"id","object":"response","deleted":true}, and GET /v1/responses/{id}/input_items
// lists its input as one message item. An id this server does not hold is answered 404 in the
// OpenAI shape, as vLLM answers it. A deleted response can no longer be followed up.

// storedResponse is what GET and input_items answer about one stored response.
type storedResponse struct {
	object map[string]any // the completed response object
	input  string         // the turn's input text
	itemID string
}

func (s *Server) storedRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /v1/responses/{id}", s.handleGetResponse)
	m.HandleFunc("DELETE /v1/responses/{id}", s.handleDeleteResponse)
	m.HandleFunc("GET /v1/responses/{id}/input_items", s.handleInputItems)
}

// lookupStored returns the stored response id, or answers 404.
func (s *Server) lookupStored(w http.ResponseWriter, id string) (storedResponse, bool) {
	s.convs.mu.Lock()
	st, ok := s.convs.stored[id]
	s.convs.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "response_id",
			"Response with id '%s' not found.", id)
	}
	return st, ok
}

func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	if st, ok := s.lookupStored(w, r.PathValue("id")); ok {
		writeJSON(w, st.object)
	}
}

func (s *Server) handleDeleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := s.lookupStored(w, id); !ok {
		return
	}
	c := &s.convs
	c.mu.Lock()
	c.bytes -= len(c.text[id])
	delete(c.text, id)
	delete(c.stored, id)
	c.mu.Unlock()
	writeJSON(w, map[string]any{"id": id, "object": "response", "deleted": true})
}

func (s *Server) handleInputItems(w http.ResponseWriter, r *http.Request) {
	st, ok := s.lookupStored(w, r.PathValue("id"))
	if !ok {
		return
	}
	itemID := "in_" + st.itemID
	item := map[string]any{"id": itemID, "type": "message", "role": "user", "status": "completed",
		"content": []any{map[string]any{"type": "input_text", "text": st.input}}}
	writeJSON(w, map[string]any{"object": "list", "data": []any{item}, "first_id": itemID, "last_id": itemID, "has_more": false})
}
