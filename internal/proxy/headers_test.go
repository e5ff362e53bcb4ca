package proxy

import (
	"net/http"
	"net/url"
	"strings"
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
	copyResponseHeader(out, &http.Response{Header: worker, ProtoMajor: 1, ProtoMinor: 1})
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

// TestRelativeRef: an absolute Location or Content-Location loses its scheme, credentials and
// host; a relative one is kept as it is; nothing that does not parse is relayed.
func TestRelativeRef(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/completions?x=1":                   "/v1/completions?x=1",
		"next":                                  "next",
		"http://10.0.0.7:30000/v1/models":       "/v1/models",
		"https://u:p@worker.internal/a%2Fb?q#f": "/a%2Fb?q#f",
		"http://10.0.0.7:30000":                 "/",
		"//10.0.0.7:30000/x":                    "/x",
		"mailto:ops@internal":                   "/",
		"http://[::1]:8000/v1/chat/completions": "/v1/chat/completions",
		"http://bad host/%zz":                   "/",
		"/\\evil.example/x":                     "/evil.example/x",
		"http://h//evil.example/x":              "/evil.example/x",
	} {
		if got := relativeRef(in); got != want {
			t.Errorf("relativeRef(%q) = %q, want %q", in, got, want)
		}
	}
	out := http.Header{}
	copyResponseHeader(out, &http.Response{Header: http.Header{"Location": {"http://10.0.0.7:30000/a"}, "Content-Location": {"/b"}}})
	if out.Get("Location") != "/a" || out.Get("Content-Location") != "/b" {
		t.Errorf("copied %v", out)
	}
}

func FuzzRelativeRef(f *testing.F) {
	for _, s := range []string{"/a", "http://h:1/p?q#f", "//h/x", "mailto:x", "http://[::1]/", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r := relativeRef(s)
		u, err := url.Parse(r)
		if err != nil {
			t.Fatalf("relativeRef(%q) = %q does not parse: %v", s, r, err)
		}
		if u.Scheme != "" || u.Host != "" || u.User != nil || strings.HasPrefix(r, "/\\") {
			t.Fatalf("relativeRef(%q) = %q still names a host", s, r)
		}
	})
}
