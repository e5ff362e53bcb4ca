package gateway

import "fmt"

// ConnReuseLabel is the worker label that says whether a connection to that worker carries more
// than one request: "always" or "never", overriding --worker-conn-reuse. Only the admin plane
// sets labels; a worker that echoes no request id cannot have its answers bound to their
// requests, and "never" is the one way to keep its stray answers from other clients
// (docs/security.md).
const ConnReuseLabel = "conn_reuse"

// checkConnReuseLabel validates a conn_reuse label value.
func checkConnReuseLabel(labels map[string]string) error {
	v, ok := labels[ConnReuseLabel]
	if !ok || v == "always" || v == "never" {
		return nil
	}
	return fmt.Errorf("label %s: want always or never", ConnReuseLabel)
}
