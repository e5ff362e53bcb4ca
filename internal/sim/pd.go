package sim

import (
	"encoding/json"
	"strconv"

	"github.com/kvgate/kvgate/internal/engine"
)

// vLLM's prefill/decode roles (the NIXL connector's kv_transfer_params), so that one simulated
// engine can be the prefill or the decode worker of a disaggregated pool:
//
//   - a request with kv_transfer_params {"do_remote_decode": true} is a prefill: it runs as sent
//     (the gateway asks for one token) and its answer carries the kv_transfer_params a decode
//     worker needs: do_remote_prefill true, this engine's id, the prompt's block ids, a host
//     and port, tp_size 1;
//   - a request with {"do_remote_prefill": true} and block ids is a decode: its prompt's KV is
//     taken as transferred, so the engine computes only the prompt's last block, and the usage
//     counts the rest of the prompt as cached.
//
// Nothing is really transferred: the roles exist so that the gateway's two-step protocol runs
// against real ports, and a decode worker's time to first token is that of a transferred prompt.

// kvTransfer is what the simulator reads of a request's kv_transfer_params.
type kvTransfer struct {
	DoRemoteDecode  bool              `json:"do_remote_decode"`
	DoRemotePrefill bool              `json:"do_remote_prefill"`
	RemoteBlockIDs  []json.RawMessage `json:"remote_block_ids"`
}

// prefillRole reports whether r is the prefill half of a disaggregated request.
func (r *request) prefillRole() bool { return r.kv != nil && r.kv.DoRemoteDecode }

// decodeRole reports whether r is the decode half, with its prompt's KV transferred.
func (r *request) decodeRole() bool {
	return r.kv != nil && r.kv.DoRemotePrefill && len(r.kv.RemoteBlockIDs) > 0
}

// enginePrompt is what the engine computes of r's prompt: all of it, or for a decode with
// transferred KV only its last block of blockSize tokens. full is the prompt's tokens.
func (r *request) enginePrompt(blockSize int) (text string, toks []uint32, full int) {
	text, toks = r.prompt, r.tokens
	full = len(toks)
	if toks == nil {
		full = engine.TokenCount(text)
	}
	if !r.decodeRole() || full <= blockSize {
		return text, toks, full
	}
	if toks != nil {
		return "", toks[len(toks)-blockSize:], full
	}
	return text[len(text)-blockSize*engine.BytesPerToken:], nil, full
}

// pdUsage corrects the engine's prompt and cached counts of a decode with transferred KV: the
// prompt is the whole one, and what was transferred counts as cached.
func (r *request) pdUsage(blockSize, prompt, cached int) (int, int) {
	_, _, full := r.enginePrompt(blockSize)
	if !r.decodeRole() || full <= prompt {
		return prompt, cached
	}
	return full, cached + full - prompt
}

// transferParams is the kv_transfer_params a prefill answers with: its blocks, by index.
func (s *Server) transferParams(r *request) map[string]any {
	_, _, full := r.enginePrompt(s.blockSize())
	bs := s.blockSize()
	n := (full + bs - 1) / bs
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return map[string]any{"do_remote_decode": false, "do_remote_prefill": true,
		"remote_engine_id": "kvgate-sim-" + strconv.FormatInt(s.start.UnixNano(), 36), "remote_block_ids": ids,
		"remote_host": "127.0.0.1", "remote_port": 0, "tp_size": 1}
}

// blockSize is the engine's KV block size, defaults applied.
func (s *Server) blockSize() int { return s.eng.Config().BlockSize }
