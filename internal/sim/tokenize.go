package sim

import (
	"encoding/json"
	"net/http"

	"github.com/kvgate/kvgate/internal/engine"
)

// handleTokenize is vLLM's POST /tokenize: {"model", "prompt"} or {"model", "messages"}
// answered with {"count", "max_model_len", "tokens"}. The tokens are the engine's own (chat
// messages are joined as the inference routes join them), so a router that keys blocks by them
// matches the blocks the engine's events report.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	kind := completionAPI
	if json.Unmarshal(body, &probe) == nil && len(probe.Messages) > 0 {
		kind = chatAPI
	}
	req, err := parseRequest(kind, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "%v", err)
		return
	}
	if req.model != "" && req.model != s.cfg.Model && !s.loras.has(req.model) { // an adapter tokenizes as its base, as in vLLM
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"The model `%s` does not exist.", req.model)
		return
	}
	toks := req.tokens
	if toks == nil {
		toks = engine.Tokenize(req.prompt)
	}
	writeJSON(w, struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}{len(toks), s.eng.Config().KVTokens, toks})
}
