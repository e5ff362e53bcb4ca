package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"io"
	"math"
	"net/http"
)

// embeddingDims is the length of the simulator's embedding vectors.
const embeddingDims = 32

// maxEmbeddingInputs bounds the inputs of one embeddings request, as OpenAI's API does.
const maxEmbeddingInputs = 2048

// handleEmbeddings answers POST /v1/embeddings: each input is prefilled by the engine (so that it
// costs what a prompt costs and warms the prefix cache) and answered with a deterministic unit
// vector derived from its text, as float arrays or, with "encoding_format": "base64", as
// little-endian float32 bytes.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", "", "request body over %d bytes", maxBody)
		return
	}
	var b struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "malformed JSON body: %v", err)
		return
	}
	if b.Model != "" && b.Model != s.cfg.Model {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model", "The model `%s` does not exist.", b.Model)
		return
	}
	if b.EncodingFormat != "" && b.EncodingFormat != "float" && b.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "encoding_format", "encoding_format must be float or base64")
		return
	}
	inputs, err := embeddingInputs(b.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "input", "%v", err)
		return
	}
	notify := make(chan struct{}, 1)
	var ids []uint64
	var wts []*waiter
	finished := false
	defer func() {
		if !finished {
			for _, id := range ids {
				s.abort(id)
			}
		}
	}()
	for _, in := range inputs {
		id, wt, err := s.submit(request{prompt: in}, 1, notify)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", "input", "%v", err)
			return
		}
		ids, wts = append(ids, id), append(wts, wt)
	}
	prompt := 0
	for i := 0; i < len(wts); {
		s.mu.Lock()
		done, n := wts[i].done, wts[i].prompt
		s.mu.Unlock()
		if done {
			prompt += n
			i++
			continue
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			return
		case <-s.stop:
			writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "", "server closing")
			return
		}
	}
	finished = true
	data := make([]map[string]any, len(inputs))
	for i, in := range inputs {
		var v any = embedding(in)
		if b.EncodingFormat == "base64" {
			var buf bytes.Buffer
			for _, f := range embedding(in) {
				_ = binary.Write(&buf, binary.LittleEndian, f)
			}
			v = base64.StdEncoding.EncodeToString(buf.Bytes())
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": v}
	}
	writeJSON(w, map[string]any{"object": "list", "data": data, "model": s.cfg.Model,
		"usage": map[string]int{"prompt_tokens": prompt, "total_tokens": prompt}})
}

// embeddingInputs decodes "input": a string or an array of strings.
func embeddingInputs(raw json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, badRequest("input must not be empty")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, badRequest("input must be a non-empty string or array of strings")
	}
	if len(many) > maxEmbeddingInputs {
		return nil, badRequest("input holds %d items, over the limit of %d", len(many), maxEmbeddingInputs)
	}
	for _, s := range many {
		if s == "" {
			return nil, badRequest("input must not hold an empty string")
		}
	}
	return many, nil
}

// embedding is a deterministic unit vector for text: equal texts embed equally.
func embedding(text string) []float32 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, text)
	x := h.Sum64()
	v := make([]float32, embeddingDims)
	var norm float64
	for i := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		f := float64(int64(x>>11))/float64(1<<52) - 1
		v[i], norm = float32(f), norm+f*f
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}
