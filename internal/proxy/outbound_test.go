package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestUpstreamURL: the upstream URL built field by field is the one printing the worker's base
// URL, appending the path and parsing the result gives (the way it was built before), for base
// path prefixes, credentials, ports, IPv6 hosts, escaped prefixes and client queries (less a
// fragment, which is never sent).
func TestUpstreamURL(t *testing.T) {
	bases := []string{
		"http://127.0.0.1:8000",
		"http://127.0.0.1:8000/",
		"https://worker.example:8443/engine/v2",
		"http://user:p%40ss@10.0.0.1:30000/sglang/",
		"http://[::1]:8000/a",
		"http://h:/x",
		"http://h/a%2Fb",      // an escaped prefix keeps its escaping
		"http://h/with%20sp/", // a prefix with a space
		"http://h/caf%C3%A9",
	}
	paths := []string{
		"/v1/chat/completions",
		"/generate?x=1",
		"/v1/completions?api-version=2024-06-01&x=a%20b&y=%2F",
		"/v1/embeddings?a=1#frag",
		"/v1/models?",
		"/v1/x?q=caf%C3%A9;y",
	}
	for _, b := range bases {
		base, err := worker.ParseURL(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			want, err := http.NewRequest(http.MethodPost, base.String()+p, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := newUpstreamRequest(context.Background(), base, p, 4)
			if err != nil {
				t.Fatalf("%s + %s: %v", b, p, err)
			}
			want.URL.Fragment, want.URL.RawFragment = "", "" // never sent
			if got.URL.String() != want.URL.String() || got.URL.RequestURI() != want.URL.RequestURI() ||
				got.Host != want.Host || got.URL.Host != want.URL.Host || got.URL.User.String() != want.URL.User.String() {
				t.Errorf("%s + %s: got %s (host %q, target %q), want %s (host %q, target %q)", b, p,
					got.URL, got.Host, got.URL.RequestURI(), want.URL, want.Host, want.URL.RequestURI())
			}
			if got.Method != http.MethodPost || got.Header == nil || len(got.Header) != 0 {
				t.Errorf("%s + %s: method %s, header %v", b, p, got.Method, got.Header)
			}
		}
	}
	if _, err := newUpstreamRequest(context.Background(), &url.URL{Scheme: "http", Host: "h"}, "v1/x", 0); err == nil {
		t.Error("a path without a leading slash was accepted")
	}
}

// TestUpstreamTargetOnTheWire: a worker registered under a path prefix, with credentials in its
// URL, receives the prefixed path, the client's query as sent, and basic credentials from the URL.
func TestUpstreamTargetOnTheWire(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	base := strings.Replace(srv.URL, "http://", "http://u:secret@", 1) + "/engine/"
	w, err := worker.New(worker.Spec{URL: base, Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	res := newForwarder(nil, 1).Forward(context.Background(), httptest.NewRecorder(),
		&Request{Path: "/v1/chat/completions?api-version=1&x=a%20b", Body: []byte(`{}`), Header: http.Header{}}, func([]*worker.Worker) *worker.Worker { return w })
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	r := <-got
	if r.RequestURI != "/engine/v1/chat/completions?api-version=1&x=a%20b" {
		t.Errorf("worker saw %q", r.RequestURI)
	}
	if u, p, ok := r.BasicAuth(); !ok || u != "u" || p != "secret" {
		t.Errorf("worker saw credentials %q %q %v", u, p, ok)
	}
	if r.Host != strings.TrimPrefix(srv.URL, "http://") {
		t.Errorf("worker saw Host %q", r.Host)
	}
}

// TestForwardedFields: the worker sees the gateway's request id (not the client's) and the
// client's address appended to any X-Forwarded-For chain it came with, or alone.
func TestForwardedFields(t *testing.T) {
	for _, c := range []struct {
		prior []string
		want  string
	}{
		{nil, "127.0.0.9"},
		{[]string{"10.0.0.1"}, "10.0.0.1, 127.0.0.9"},
		{[]string{"10.0.0.1, 10.0.0.2", "10.0.0.3"}, "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.9"},
	} {
		got := make(chan http.Header, 1)
		a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { got <- r.Header })
		h := http.Header{"X-Request-Id": {"client-id"}}
		if c.prior != nil {
			h["X-Forwarded-For"] = c.prior
		}
		res := newForwarder(nil, 1).Forward(context.Background(), httptest.NewRecorder(),
			&Request{Path: "/x", Body: []byte(`{}`), Header: h, RequestID: "gw-id", ClientIP: "127.0.0.9"}, inOrder(a))
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		seen := <-got
		if v := seen.Values("X-Forwarded-For"); len(v) != 1 || v[0] != c.want {
			t.Errorf("prior %q: worker saw X-Forwarded-For %q, want %q", c.prior, v, c.want)
		}
		// Neither the client's id nor the request's: the attempt's own, which binds its answer.
		if v := seen.Values("X-Request-Id"); len(v) != 1 || !strings.HasPrefix(v[0], attemptIDPrefix) {
			t.Errorf("worker saw X-Request-Id %q, want the attempt's own", v)
		}
	}
}

// TestRedirectRelayed: a worker's redirect reaches the client, its Location cut to a reference
// relative to the gateway (an absolute one names an internal address); the gateway follows it
// nowhere (a redirect could point anywhere, past the hosts workers may live on).
func TestRedirectRelayed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/v1/completions", http.StatusTemporaryRedirect)
	})
	rec := httptest.NewRecorder()
	res := newForwarder(nil, 1).Forward(context.Background(), rec, &Request{Path: "/v1/completions", Body: []byte(`{}`), Header: http.Header{}}, inOrder(up))
	if res.Err != nil || rec.Code != http.StatusTemporaryRedirect || rec.Header().Get("Location") != "/v1/completions" {
		t.Errorf("err %v, status %d, location %q", res.Err, rec.Code, rec.Header().Get("Location"))
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect was followed %d times", n)
	}
}

// TestSmallBodyIsTheRequestsOwn: a small body is sent from a copy, so the caller may reuse its
// buffer as soon as Forward returns, even while the transport still reads (lateReader), and its
// hold is not taken.
func TestSmallBodyIsTheRequestsOwn(t *testing.T) {
	lr := &lateReader{read: make(chan string, 1), release: make(chan struct{})}
	w, err := worker.New(worker.Spec{URL: "http://127.0.0.1:1", Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	ref := &countRef{}
	buf := []byte(`{"prompt":"p"}`)
	res := New(Config{Transport: lr}).Forward(context.Background(), httptest.NewRecorder(),
		&Request{Path: "/v1/completions", Header: http.Header{}, Body: buf, BodyRef: ref},
		func(tried []*worker.Worker) *worker.Worker { return []*worker.Worker{w, nil}[len(tried)] })
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if n := ref.n.Load(); n != 0 {
		t.Errorf("%d holds taken on a small body", n)
	}
	copy(buf, "XXXXXXXXXXXXXX") // the caller reuses its buffer
	close(lr.release)
	if got := <-lr.read; got != `{"prompt":"p"}` {
		t.Errorf("the transport read %q", got)
	}
}

// countConn counts the writes on a connection to a worker.
type countConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c countConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestSmallBodyOneWrite: the headers and a small body reach the worker's connection in one
// write (one system call, one TCP segment); a large body still arrives whole.
func TestSmallBodyOneWrite(t *testing.T) {
	var writes atomic.Int32
	tr := NewTransport()
	tr.DialContext = dialBodyConn(func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countConn{c, &writes}, nil
	})
	defer tr.CloseIdleConnections()
	up := newUpstream(t, status(http.StatusOK))
	f := New(Config{Transport: tr})
	for i, size := range []int{2000, 16 << 10, 64 << 10} {
		writes.Store(0)
		body := strings.Repeat("p", size)
		res := f.Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/v1/completions", Header: http.Header{}, Body: []byte(body)},
			func(tried []*worker.Worker) *worker.Worker { return []*worker.Worker{up.w, nil}[len(tried)] })
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		if n := writes.Load(); size <= 16<<10 && n != 1 {
			t.Errorf("%d-byte body: %d writes, want 1", size, n)
		}
		up.mu.Lock()
		if len(up.bodies) != i+1 || up.bodies[i] != body {
			t.Errorf("%d-byte body: the worker did not get it whole", size)
		}
		up.mu.Unlock()
	}
}

// BenchmarkUpstreamRequest builds an attempt's upstream request (URL, headers, credentials, a
// 1 KB body) for the headers of two clients: Go's http.Client, and the OpenAI Python SDK
// (httpx), which sends more of them.
//
//	go test -run XXX -bench UpstreamRequest -benchmem ./internal/proxy/
func BenchmarkUpstreamRequest(b *testing.B) {
	w, err := worker.New(worker.Spec{URL: "http://127.0.0.1:30000", Models: []string{"m"}}, worker.BreakerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	w.SetHealth(worker.Ready)
	f := New(Config{HopID: "gw1"})
	body := []byte(strings.Repeat("x", 1000))
	for _, c := range []struct {
		name   string
		header http.Header
	}{
		{"go", http.Header{"User-Agent": {"Go-http-client/1.1"}, "Content-Length": {"1000"}, "Content-Type": {"application/json"}, "Accept-Encoding": {"gzip"}}},
		{"openai-python", http.Header{
			"Accept": {"application/json"}, "Accept-Encoding": {"gzip, deflate"}, "Connection": {"keep-alive"},
			"User-Agent": {"OpenAI/Python 1.54.0"}, "Content-Type": {"application/json"}, "Content-Length": {"1000"},
			"Authorization": {"Bearer k"}, "X-Stainless-Lang": {"python"}, "X-Stainless-Os": {"Linux"},
		}},
	} {
		req := &Request{Path: "/v1/chat/completions", Header: c.header, Body: body, RequestID: "r1", ClientIP: "127.0.0.1"}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var a attempt
				if _, ok := f.begin(context.Background(), w, req, &a); !ok {
					b.Fatal("not admitted")
				}
				a.end()
			}
		})
	}
}
