package sim

import (
	"net/http"
	"strings"
	"testing"
)

// The simulator echoes a request's X-Request-Id in its answer, as vLLM does with
// --enable-request-id-headers, so that a gateway can bind each answer to its request; an id
// that could inject a header, or an oversized one, is not echoed.
func TestRequestIDEchoed(t *testing.T) {
	_, ts := startServer(t, fastConfig())
	for id, want := range map[string]string{"kvg-0123": "kvg-0123", strings.Repeat("x", 200): "", "a b": ""} {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model":"sim","prompt":"x","max_tokens":1}`))
		req.Header.Set("X-Request-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Request-Id"); got != want {
			t.Errorf("sent id %q: answer's X-Request-Id %q, want %q", id[:min(len(id), 10)], got, want)
		}
	}
}
