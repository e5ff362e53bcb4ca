package proxy

import (
	"net/http"
	"testing"
)

// TestHeaderCopies: hop-by-hop fields, and the fields a Connection header lists (any case, any
// spacing, over several Connection lines), are not copied either way; end-to-end fields are;
// the gateway's own fields in the response are kept whatever the worker's Connection lists.
func TestHeaderCopies(t *testing.T) {
	client := http.Header{
		"Connection":      {"keep-alive, x-secret", " X-Other ,"},
		"Keep-Alive":      {"timeout=5"},
		"X-Secret":        {"s"},
		"X-Other":         {"o"},
		"Te":              {"trailers"},
		"Content-Type":    {"application/json"},
		"X-Custom":        {"c"},
		"Host":            {"h"},
		"X-Request-Id":    {"client"},
		"X-Forwarded-For": {"10.0.0.1"},
	}
	up := http.Header{}
	copyRequestHeader(up, client)
	for _, k := range []string{"Connection", "Keep-Alive", "X-Secret", "X-Other", "Te", "Host", "X-Request-Id", "X-Forwarded-For"} {
		if _, ok := up[k]; ok {
			t.Errorf("request: %s copied", k)
		}
	}
	for _, k := range []string{"Content-Type", "X-Custom"} {
		if up.Get(k) != client.Get(k) {
			t.Errorf("request: %s not copied", k)
		}
	}

	out := http.Header{"X-Request-Id": {"gw-id"}, "Access-Control-Allow-Origin": {"*"}}
	worker := http.Header{
		"Connection":                  {"X-Request-Id, Access-Control-Allow-Origin, X-Engine-Debug"},
		"X-Engine-Debug":              {"d"},
		"Transfer-Encoding":           {"chunked"},
		"Content-Type":                {"text/event-stream"},
		"X-Request-Id":                {"worker-id"},
		"Access-Control-Allow-Origin": {"https://evil.example"},
	}
	copyResponseHeader(out, worker)
	if out.Get("X-Request-Id") != "gw-id" || out.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("response: the gateway's own fields changed: %v", out)
	}
	for _, k := range []string{"Connection", "X-Engine-Debug", "Transfer-Encoding"} {
		if _, ok := out[k]; ok {
			t.Errorf("response: %s copied", k)
		}
	}
	if out.Get("Content-Type") != "text/event-stream" {
		t.Error("response: Content-Type not copied")
	}
}

// BenchmarkCopyRequestHeader copies the headers of a request from the OpenAI Python SDK (httpx),
// which sends "Connection: keep-alive".
//
//	go test -run XXX -bench CopyRequestHeader -benchmem ./internal/proxy/
func BenchmarkCopyRequestHeader(b *testing.B) {
	src := http.Header{
		"Accept": {"application/json"}, "Accept-Encoding": {"gzip, deflate"}, "Connection": {"keep-alive"},
		"User-Agent": {"OpenAI/Python 1.54.0"}, "Content-Type": {"application/json"}, "Content-Length": {"1000"},
		"Authorization": {"Bearer k"}, "X-Stainless-Lang": {"python"}, "X-Stainless-Os": {"Linux"},
	}
	b.ReportAllocs()
	for b.Loop() {
		dst := make(http.Header, len(src)+upstreamHeaders)
		copyRequestHeader(dst, src)
	}
}
