package sim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

// maxBody is the largest request body accepted.
const maxBody = 32 << 20

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/chat/completions", s.inference(chatAPI))
	m.HandleFunc("POST /v1/completions", s.inference(completionAPI))
	m.HandleFunc("POST /generate", s.inference(generateAPI))
	m.HandleFunc("POST /v1/responses", s.handleResponses)
	s.storedRoutes(m)
	s.messagesRoutes(m)
	m.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	m.HandleFunc("GET /v1/models", s.handleModels)
	m.HandleFunc("GET /health", s.handleHealth)
	m.HandleFunc("GET /v1/loads", s.handleLoads)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("POST /flush_cache", s.handleFlush)
	m.HandleFunc("POST /reset_prefix_cache", s.handleFlush)
	m.HandleFunc("POST /tokenize", s.handleTokenize)
	m.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLora)
	m.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLora)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "",
			"no route %s %s", r.Method, r.URL.Path)
	})
	s.mux = m
}

// ServeHTTP serves the simulated server's routes, with the injected faults that apply to all of
// them (hang, slow start).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every answer names the request it answers, as vLLM does with --enable-request-id-headers:
	// a gateway binds answers to requests by it. An id is echoed only when it is short and
	// printable, so no header can be injected through it.
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= maxEchoedID && printableID(id) {
		w.Header().Set("X-Request-Id", id)
	}
	f := s.faults.Load()
	if f.Hang {
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
		return
	}
	if r.URL.Path != "/metrics" && time.Now().Before(f.slowUntil) {
		writeError(w, http.StatusServiceUnavailable, "server_error", "loading", "",
			"the engine is starting")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": s.models()})
}

func (s *Server) handleFlush(w http.ResponseWriter, _ *http.Request) {
	n := s.FlushCache()
	writeJSON(w, map[string]any{"success": true, "flushed_tokens": n})
}

// readBody reads a request body of at most maxBody bytes; on failure it answers the client
// (413 or 400) and reports false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		return body, true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", "",
			"request body over %d bytes", maxBody)
		return nil, false
	}
	writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "reading body: %v", err)
	return nil, false
}

// inference returns the handler of one inference endpoint.
func (s *Server) inference(kind apiKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		req, err := parseRequest(kind, body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "%v", err)
			return
		}
		if kind != generateAPI {
			if req.adapter, ok = s.adapterOf(req.model); !ok {
				writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
					"The model `%s` does not exist.", req.model)
				return
			}
		}
		s.serveInference(w, r, kind, req)
	}
}

// serveInference serves a parsed inference request, with the injected faults that apply to
// inference (errors, a first-token delay, dying mid-answer).
func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, kind apiKind, req request) {
	f := s.faults.Load()
	if s.rollError(f.ErrorRate) {
		status := f.ErrorStatus
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		writeError(w, status, "server_error", "injected_fault", "", "injected fault: status %d", status)
		return
	}
	if f.FirstTokenDelay > 0 && !s.pause(r.Context(), f.FirstTokenDelay) {
		return
	}
	s.serve(r.Context(), w, kind, req, f.DieAfterTokens)
}

// pause waits d unless the client leaves or the server closes first; it reports whether d
// passed.
func (s *Server) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-s.stop:
	}
	return false
}

// serve runs one request through the engine and writes its answer, streamed or whole. Each of
// the request's n choices is its own engine sequence (they share the prompt, so all but the
// first hit the prefix cache, as on a real engine).
func (s *Server) serve(ctx context.Context, w http.ResponseWriter, kind apiKind, req request, dieAfter int) {
	maxTokens := req.maxTokens
	if maxTokens == 0 {
		maxTokens = s.cfg.MaxTokens
	}
	n := max(req.n, 1)
	notify := make(chan struct{}, 1) // one wake-up for every choice
	ids := make([]uint64, 0, n)
	wts := make([]*waiter, 0, n)
	finished := false
	defer func() {
		if !finished {
			for _, id := range ids {
				s.abort(id)
			}
		}
	}()
	for range n {
		id, wt, err := s.submit(req, maxTokens, notify)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", "",
				"%v", err)
			return
		}
		ids, wts = append(ids, id), append(wts, wt)
	}
	model := s.cfg.Model
	if req.adapter != "" {
		model = req.adapter
	}
	out := newWriter(w, kind, model, ids, req)
	if req.prefillRole() {
		out.extra = map[string]any{"kv_transfer_params": s.transferParams(&req)}
	}
	sent := make([]int, n)
	ended := make([]bool, n)
	var u usage
	for left := n; left > 0; {
		select {
		case <-notify:
		case <-ctx.Done():
			return
		case <-s.stop:
			if slices.ContainsFunc(sent, func(k int) bool { return k > 0 }) || req.stream {
				panic(http.ErrAbortHandler)
			}
			writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "", "server closing")
			return
		}
		for i, wt := range wts {
			if ended[i] {
				continue
			}
			s.mu.Lock()
			tokens, done, cached, prompt := wt.tokens, wt.done, wt.cached, wt.prompt
			s.mu.Unlock()
			if dieAfter > 0 && tokens >= dieAfter {
				if req.stream && dieAfter > sent[i] {
					out.tokens(i, sent[i], dieAfter)
				}
				panic(http.ErrAbortHandler) // drops the connection; the deferred abort frees the KV
			}
			if req.stream && tokens > sent[i] {
				if err := out.tokens(i, sent[i], tokens); err != nil {
					return
				}
				sent[i] = tokens
			}
			if done {
				ended[i], left = true, left-1
				out.ended(i, tokens)
				if i == 0 { // the prompt is counted once, as OpenAI does
					u.PromptTokens, u.CachedTokens = req.pdUsage(s.blockSize(), prompt, cached)
				}
				u.CompletionTokens += tokens
			}
		}
	}
	finished = true
	out.finish(u)
}

// generatedText returns output tokens [from, to) of request id: a deterministic word per token,
// 4 bytes each, so that the text is as many engine tokens long as reported.
func generatedText(id uint64, from, to int) string {
	b := make([]byte, 0, (to-from)*engine.BytesPerToken)
	for i := from; i < to; i++ {
		b = append(b, words[(id*7+uint64(i))%uint64(len(words))]...)
	}
	return string(b)
}

var words = [...]string{"the ", "and ", "for ", "you ", "not ", "are ", "but ", "all ",
	"any ", "can ", "had ", "was ", "one ", "our ", "out ", "day "}

// maxEchoedID bounds the request id the simulator echoes, in bytes.
const maxEchoedID = 128

// printableID reports whether id is visible ASCII only.
func printableID(id string) bool {
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}
