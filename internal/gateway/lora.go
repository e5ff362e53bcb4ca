package gateway

import "github.com/kvgate/kvgate/internal/worker"

// LoRA adapters. vLLM lists each adapter it serves in /v1/models as a model whose "parent" is its
// base model; the registration probe records those parents (worker.Spec.Parents), so that an
// adapter is a pool of its own — a request for it goes only to workers that list it — and the
// policy knows the request names an adapter (policy.Request.Adapter), which the cost's adapter
// term prices from each worker's vllm:lora_requests_info.

// maxParentName bounds the parent names kept from a probe, in bytes; longer ones are dropped.
const maxParentName = 256

// withParent records id's parent in m (allocated on first use) when the worker gave one that is
// not id itself.
func withParent(m map[string]string, id string, parent *string) map[string]string {
	if parent == nil || *parent == "" || *parent == id || len(*parent) > maxParentName {
		return m
	}
	if m == nil {
		m = map[string]string{}
	}
	m[id] = *parent
	return m
}

// adapterParents keeps the parents of the models the worker is registered for.
func adapterParents(models []string, parents map[string]string) map[string]string {
	var out map[string]string
	for _, m := range models {
		if p := parents[m]; p != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[m] = p
		}
	}
	return out
}

// adapterOf is the adapter a request for pool's model names, "" for a base model.
func adapterOf(pool *worker.Pool) string {
	if pool.Parent != "" {
		return pool.Model
	}
	return ""
}
