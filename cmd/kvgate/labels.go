package main

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// applyWorkerLabels sets labels on configured workers from --worker-label entries of the form
// KEY=VALUE@URL (for example cb_timeout=10s@http://10.0.0.7:8000): the per-worker overrides of
// the health-check and breaker knobs, or any other label, for workers given by flag rather than
// through POST /workers. The label api_key sets the worker's own upstream key instead (it is not
// kept as a label, which the admin API shows). URLs match after normalisation; an entry naming no
// configured worker, or an override that does not parse, is an error.
// workerAPIKeyLabel is the --worker-label key that sets a configured worker's upstream key.
const workerAPIKeyLabel = "api_key"

func applyWorkerLabels(regs []gateway.AddWorkerRequest, entries []string) error {
	for _, e := range entries {
		kv, raw, ok := strings.Cut(e, "@")
		key, val, okKV := strings.Cut(kv, "=")
		if !ok || !okKV || key == "" {
			return fmt.Errorf("--worker-label %q: want KEY=VALUE@URL", e)
		}
		u, err := worker.ParseURL(raw)
		if err != nil {
			return fmt.Errorf("--worker-label %q: %w", e, err)
		}
		found := false
		for i := range regs {
			ru, err := worker.ParseURL(regs[i].URL)
			if err != nil || ru.String() != u.String() {
				continue
			}
			found = true
			if key == workerAPIKeyLabel {
				regs[i].APIKey = val
				continue
			}
			labels := make(map[string]string, len(regs[i].Labels)+1)
			for k, v := range regs[i].Labels {
				labels[k] = v
			}
			labels[key] = val
			regs[i].Labels = labels
		}
		if !found {
			return fmt.Errorf("--worker-label %q: %s is not a configured worker", e, u)
		}
	}
	for _, a := range regs {
		if _, err := worker.DefaultBreakerConfig().WithLabels(a.Labels); err != nil {
			return fmt.Errorf("worker %s: %w", a.URL, err)
		}
		if _, err := worker.DefaultHealthConfig().WithLabels(a.Labels); err != nil {
			return fmt.Errorf("worker %s: %w", a.URL, err)
		}
	}
	return nil
}
