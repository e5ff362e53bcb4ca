package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/worker"
)

// serveDisaggregated runs a request on a prefill/decode pair (SGLang bootstrap protocol): it
// picks one prefill and one decode worker, adds bootstrap_host, bootstrap_port and bootstrap_room
// to the body, sends it to both at once, and relays the decode worker's answer.
func (s *Server) serveDisaggregated(w http.ResponseWriter, r *http.Request, path string, body []byte, p *Parsed, pool *worker.Pool) proxy.Result {
	if s.pdProtocol(pool) == PDVLLM {
		return s.serveNIXL(w, r, path, body, p, pool)
	}
	ppol, err1 := s.router.For(pool.Model, worker.Prefill)
	dpol, err2 := s.router.For(pool.Model, worker.Decode)
	if err1 != nil || err2 != nil {
		writeError(w, http.StatusInternalServerError, "policy_error", fmt.Sprint(err1, err2))
		return proxy.Result{Status: http.StatusInternalServerError}
	}
	// The prefill side holds the prompts' caches: its tree says where the routing text ends.
	preq := &policy.Request{Model: pool.Model, Text: s.routingText(ppol, body, p), PromptBytes: len(body), Salt: p.Salt, Salted: p.Salted}
	preq.Key, preq.Affinity = s.sessionKeys(r.Header, p)
	policy.Prepare(r.Context(), ppol, pool.Prefill, preq)
	pw := ppol.Pick(r.Context(), pool.Prefill, preq)
	if pw == nil {
		writeError(w, http.StatusServiceUnavailable, "no_available_worker", fmt.Sprintf("no available prefill worker for model %q", pool.Model))
		return proxy.Result{Status: http.StatusServiceUnavailable}
	}
	s.metrics.selected(ppol.Name(), pool.Model, pw)
	if p.Bootstrap {
		body = withoutBootstrap(body)
	}
	policy.Prepare(r.Context(), dpol, pool.Decode, preq) // the decode side's pick, below, does no I/O
	pdBody := s.withBootstrap(body, pw)
	defer pdBody.Release()
	id := requestID(r)
	w.Header().Set("X-Request-Id", id)
	req := &proxy.Request{Path: upstreamPath(path, r), Header: r.Header, Body: pdBody.Bytes(), BodyRef: pdBody, RequestID: id, ClientIP: clientIP(r), Stream: p.Stream}

	// The decode worker waits for the KV cache the prefill worker sends: if the prefill request
	// fails, the decode side would wait until its timeout, so it is cancelled at once and the
	// client told why.
	dctx, cancelDecode := context.WithCancel(r.Context())
	defer cancelDecode()
	var prefillErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.fwd.Discard(r.Context(), pw, req); err != nil {
			s.log.Debug("prefill request failed", "request_id", id, "worker", pw.ID, "err", err)
			if r.Context().Err() == nil {
				prefillErr = err
				cancelDecode()
			}
		}
	}()
	// The pair is fixed once the prefill side is running: a retry would need a new room.
	picked := false
	res := s.fwd.Forward(dctx, w, req, func(tried []*worker.Worker) *worker.Worker {
		if picked {
			return nil
		}
		picked = true
		dw := dpol.Pick(dctx, pool.Decode, preq)
		if dw != nil {
			s.metrics.selected(dpol.Name(), pool.Model, dw)
		}
		return dw
	})
	wg.Wait()
	var pe *proxy.Error
	if errors.As(prefillErr, &pe) && !res.Committed {
		res.Err, res.Status = pe, http.StatusBadGateway
		if pe.Kind == proxy.KindTimeout {
			res.Status = http.StatusGatewayTimeout
		}
		s.log.Warn("request failed", "request_id", id, "model", pool.Model, "prefill_worker", pw.ID, "status", res.Status, "err", pe)
		writeError(w, res.Status, codeFor(res.Status), "the prefill worker failed: "+failureMessage(pe)+" (request id "+id+")")
		return res
	}
	s.finish(w, r, res, pool.Model, p.Stream, id)
	return res
}

// withBootstrap returns a copy of the JSON object body with the bootstrap fields first, in a
// pooled Body the caller releases.
func (s *Server) withBootstrap(body []byte, prefill *worker.Worker) *Body {
	port := "null"
	if bp := prefill.Spec.BootstrapPort; bp != nil {
		port = strconv.Itoa(*bp)
	}
	head := `{"bootstrap_host":` + strconv.Quote(prefill.URL.Hostname()) +
		`,"bootstrap_port":` + port +
		`,"bootstrap_room":` + strconv.FormatUint(rand.Uint64()>>1, 10)
	rest := bytes.TrimLeft(body, " \t\r\n")[1:] // after '{': the body parsed as an object
	b := s.bodies.newBody(len(head) + 1 + len(rest))
	out := append((*b.buf)[:0], head...)
	if r := bytes.TrimLeft(rest, " \t\r\n"); len(r) > 0 && r[0] != '}' {
		out = append(out, ',')
	}
	out = append(out, rest...)
	b.n = len(out)
	return b
}

// withoutBootstrap returns the JSON object body without its top-level "bootstrap_*" members: a
// client's own bootstrap_host or bootstrap_room next to the gateway's would let a worker that
// keeps the last duplicate key fetch KV from, or join the room of, a place the client chose. Such
// bodies are rare, so this decodes and re-encodes the members (their values byte for byte).
func withoutBootstrap(body []byte) []byte {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return body // parseBody accepted it, so this does not happen
	}
	for k := range members {
		if strings.HasPrefix(k, "bootstrap_") {
			delete(members, k)
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(members)
	return bytes.TrimRight(b.Bytes(), "\n")
}
