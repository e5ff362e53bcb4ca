package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// vLLM's prefill/decode protocol (the NIXL connector's, as vLLM's own disaggregation proxy, llm-d
// and Dynamo speak it), in two steps instead of SGLang's one:
//
//  1. the prefill worker gets the request with kv_transfer_params {"do_remote_decode": true},
//     max_tokens 1 and stream false; it prefills, keeps the KV blocks, and answers with the
//     kv_transfer_params a decode worker needs to pull them (remote_engine_id,
//     remote_block_ids, remote_host, remote_port, …);
//  2. the decode worker gets the client's request with those kv_transfer_params, pulls the KV
//     and generates; its answer, streamed or not, is the client's.
//
// Each step is a forward of its own, with the regular path's retries: a prefill worker that fails
// is retried on another prefill worker, and when every prefill attempt fails the decode worker
// is sent the request without kv_transfer_params and prefills it itself, so a prefill worker that
// dies costs no client a request. A decode attempt that fails is retried on another decode worker
// with the same parameters (any decode worker can pull the blocks). A client's own
// kv_transfer_params are dropped: they name a host the decode worker would connect to.

// PD protocols, chosen per pool (PDProtocolFor).
const (
	// PDSGLang is SGLang's bootstrap protocol (disagg.go).
	PDSGLang = "sglang"
	// PDVLLM is vLLM's kv_transfer_params protocol (this file).
	PDVLLM = "vllm"
	// PDAuto chooses by the prefill worker's runtime: vLLM's protocol for a vLLM worker,
	// SGLang's otherwise.
	PDAuto = "auto"
)

// PDProtocolLabel is the worker label that sets a pool's protocol ("sglang" or "vllm"), over
// Config.PDProtocol.
const PDProtocolLabel = "pd_protocol"

// maxPrefillAnswer bounds the prefill answer read, in bytes: one token and the transfer
// parameters, whose block id list grows with the prompt (about 10 bytes a block).
const maxPrefillAnswer = 4 << 20

// ParsePDProtocol validates a protocol name ("" is PDAuto).
func ParsePDProtocol(s string) (string, error) {
	switch p := strings.ToLower(strings.TrimSpace(s)); p {
	case "", PDAuto:
		return PDAuto, nil
	case PDSGLang, PDVLLM:
		return p, nil
	}
	return "", fmt.Errorf("unknown prefill/decode protocol %q (want auto, sglang or vllm)", s)
}

// pdProtocol is the protocol of pool: the first prefill worker's pd_protocol label, else
// Config.PDProtocol, else (auto) by that worker's runtime.
func (s *Server) pdProtocol(pool *worker.Pool) string {
	if len(pool.Prefill) == 0 {
		return PDSGLang
	}
	pw := pool.Prefill[0]
	if l, err := ParsePDProtocol(pw.Label(PDProtocolLabel)); err == nil && l != PDAuto {
		return l
	}
	if p, err := ParsePDProtocol(s.cfg.PDProtocol); err == nil && p != PDAuto {
		return p
	}
	if pw.Runtime() == "vllm" {
		return PDVLLM
	}
	return PDSGLang
}

// serveNIXL runs a request on a prefill and then a decode worker with vLLM's protocol.
func (s *Server) serveNIXL(w http.ResponseWriter, r *http.Request, path string, body []byte, p *Parsed, pool *worker.Pool) proxy.Result {
	ppol, err1 := s.router.For(pool.Model, worker.Prefill)
	dpol, err2 := s.router.For(pool.Model, worker.Decode)
	if err1 != nil || err2 != nil {
		writeError(w, http.StatusInternalServerError, "policy_error", "the pool's policy could not be built")
		return proxy.Result{Status: http.StatusInternalServerError}
	}
	// The prefill side holds the prompts' caches: its tree says where the routing text ends.
	preq := &policy.Request{Model: pool.Model, Text: s.routingText(ppol, body, p), PromptBytes: len(body), Adapter: adapterOf(pool), Parent: pool.Parent, Salt: p.Salt, Salted: p.Salted}
	preq.Key, preq.Affinity = s.sessionKeys(r.Header, p)
	members, err := jsonMembers(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "the request body must be a JSON object")
		return proxy.Result{Status: http.StatusBadRequest}
	}
	id := requestID(r)
	w.Header().Set("X-Request-Id", id)
	params := s.prefillNIXL(r, path, members, p, pool, ppol, preq, id)
	delete(members, "kv_transfer_params")
	if params != nil {
		members["kv_transfer_params"] = params
	}
	dbody := encodeMembers(members)
	req := &proxy.Request{Path: upstreamPath(path, r), Header: r.Header, Body: dbody, RequestID: id, ClientIP: clientIP(r), Stream: p.Stream}
	res := s.fwd.Forward(r.Context(), w, req, s.pdPicker(r, dpol, pool.Decode, pool.Model, preq))
	s.finish(w, r, res, pool.Model, p.Stream, id)
	return res
}

// prefillNIXL runs step 1 and returns the kv_transfer_params the prefill worker answered, nil
// when no prefill attempt succeeded or the answer carried none (the decode worker then
// prefills the prompt itself).
func (s *Server) prefillNIXL(r *http.Request, path string, members map[string]json.RawMessage, p *Parsed, pool *worker.Pool, ppol policy.Policy, preq *policy.Request, id string) json.RawMessage {
	pm := make(map[string]json.RawMessage, len(members)+2)
	for k, v := range members {
		pm[k] = v
	}
	pm["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	pm["stream"] = json.RawMessage("false")
	delete(pm, "stream_options")
	pm["max_tokens"] = json.RawMessage("1")
	if _, ok := pm["max_completion_tokens"]; ok {
		pm["max_completion_tokens"] = json.RawMessage("1")
	}
	if _, ok := pm["n"]; ok {
		pm["n"] = json.RawMessage("1")
	}
	req := &proxy.Request{Path: upstreamPath(path, r), Header: r.Header, Body: encodeMembers(pm), RequestID: id, ClientIP: clientIP(r)}
	var cw captureWriter
	res := s.fwd.Forward(r.Context(), &cw, req, s.pdPicker(r, ppol, pool.Prefill, pool.Model, preq))
	if res.Err != nil || cw.status != http.StatusOK || cw.over {
		if r.Context().Err() == nil {
			wid := ""
			if res.Worker != nil {
				wid = res.Worker.ID
			}
			s.log.Warn("prefill failed: the decode worker prefills the request itself", "request_id", id,
				"model", pool.Model, "prefill_worker", wid, "status", cw.status, "attempts", res.Attempts, "err", res.Err)
		}
		return nil
	}
	var answer struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(cw.buf.Bytes(), &answer) != nil || len(answer.Params) == 0 || bytes.Equal(answer.Params, []byte("null")) || answer.Params[0] != '{' {
		s.log.Debug("prefill answer carried no kv_transfer_params", "request_id", id, "model", pool.Model)
		return nil
	}
	return answer.Params
}

// pdPicker is the regular path's picker for one side of a pair: policy.Choose leaves out the
// workers already tried while another is available. It prepares preq for pol first (the
// picks do no I/O).
func (s *Server) pdPicker(r *http.Request, pol policy.Policy, candidates []*worker.Worker, model string, preq *policy.Request) proxy.Picker {
	policy.Prepare(r.Context(), pol, candidates, preq)
	return func(tried []*worker.Worker) *worker.Worker {
		preq.Tried = tried
		w := policy.Choose(r.Context(), pol, candidates, preq)
		if w != nil {
			s.metrics.selected(pol.Name(), model, w)
		}
		return w
	}
}

// jsonMembers splits a JSON object body into its members, values byte for byte.
func jsonMembers(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("not an object")
	}
	return m, nil
}

// encodeMembers writes members back as one JSON object (keys sorted, HTML not escaped).
func encodeMembers(m map[string]json.RawMessage) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // raw messages that json.Unmarshal produced, or constants
	return bytes.TrimRight(b.Bytes(), "\n")
}

// captureWriter is the http.ResponseWriter a prefill answer is read into: its status and up to
// maxPrefillAnswer bytes (over is set past that; the answer is then not used).
type captureWriter struct {
	h      http.Header
	status int
	buf    bytes.Buffer
	over   bool
}

func (c *captureWriter) Header() http.Header {
	if c.h == nil {
		c.h = http.Header{}
	}
	return c.h
}

func (c *captureWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.buf.Len()+len(b) > maxPrefillAnswer {
		c.over = true
		return len(b), nil
	}
	return c.buf.Write(b)
}

// Flush is a no-op: the answer is read whole.
func (c *captureWriter) Flush() {}
