package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// Defect: the gateway accepted its own address as a worker (201) and never shed it. Each of its
// listeners is refused, by the hop id its probe carries, with model_id or without, through the
// admin API and through Register (which the worker flags and discovery use).
func TestRegisterRefusesSelf(t *testing.T) {
	g := newTestGateway(t, Config{APIKeys: []string{"k"}}, "round_robin")
	ms := httptest.NewServer(g.MetricsHandler())
	t.Cleanup(ms.Close)
	metrics := ms.URL
	for _, c := range []struct{ name, url string }{
		{"data plane", g.srv.URL}, {"data plane, model given", g.srv.URL}, {"admin plane", g.admin.URL}, {"metrics plane", metrics},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := g.Register(context.Background(), AddWorkerRequest{URL: c.url, ModelID: "m", APIKey: "k"})
			var re *RegisterError
			if !errors.As(err, &re) || re.Status != http.StatusConflict || re.Code != "worker_is_this_gateway" {
				t.Fatalf("registering %s: %v, want 409 worker_is_this_gateway", c.url, err)
			}
		})
	}
	resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"`+g.srv.URL+`"}`, "")
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("admin API: %d %s, want 409", resp.StatusCode, raw)
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Fatalf("%d workers registered, want none", n)
	}
	// A real worker is still taken.
	f := newFakeWorker(t, "m")
	g.mustRegister(t, AddWorkerRequest{URL: f.URL})
}

// By address: a URL whose host resolves to a listener of the gateway is refused before any probe,
// so even before the gateway listens (serve announces its addresses first).
func TestRegisterRefusesOwnAddress(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing answers on: no probe could tell
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	g.ListeningOn("0.0.0.0:" + port) // a wildcard listener, as --host 0.0.0.0 gives
	for _, u := range []string{"http://127.0.0.1:" + port, "http://localhost:" + port, "http://[::1]:" + port + "/"} {
		_, err := g.Register(context.Background(), AddWorkerRequest{URL: u, ModelID: "m"})
		var re *RegisterError
		if !errors.As(err, &re) || re.Code != "worker_is_this_gateway" {
			t.Errorf("%s: %v, want worker_is_this_gateway", u, err)
		}
	}
	// Another port on the same host is another server.
	if _, err := g.Register(context.Background(), AddWorkerRequest{URL: "http://127.0.0.1:1", ModelID: "m"}); err != nil {
		t.Errorf("a worker on another port was refused: %v", err)
	}
	// A listener on one address does not claim another.
	g2 := newTestGateway(t, Config{}, "round_robin")
	g2.ListeningOn("127.0.0.1:" + port)
	if _, err := g2.Register(context.Background(), AddWorkerRequest{URL: "http://127.0.0.2:" + port, ModelID: "m"}); err != nil {
		t.Errorf("127.0.0.2 was taken for a listener on 127.0.0.1: %v", err)
	}
}

// The hop id is echoed only to a request that carried it: a request refused for crossing too many
// gateways does not learn it.
func TestLoopAnswerKeepsHopID(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	req, _ := http.NewRequest("GET", g.srv.URL+"/v1/models", nil)
	req.Header.Set(HopHeader, "a,b,c,d,e,f,g,h,i,j")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeError(t, resp)
	if resp.StatusCode != http.StatusLoopDetected || resp.Header.Get(HopHeader) != "" {
		t.Fatalf("%d, hop header %q: want 508 without the gateway's id", resp.StatusCode, resp.Header.Get(HopHeader))
	}
}

// A worker's /v1/models that redirects to another address is not followed: the registration
// probe would otherwise reach a host nobody registered (past --allowed-worker-hosts). The
// registration fails instead, and the other host sees nothing.
func TestRegisterProbeFollowsNoRedirectAway(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	hits := make(chan struct{}, 8)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- struct{}{}
		w.Write([]byte(`{"data":[{"id":"m"}]}`))
	}))
	t.Cleanup(other.Close)
	away := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/v1/models", http.StatusFound)
	}))
	t.Cleanup(away.Close)
	if _, err := g.Register(context.Background(), AddWorkerRequest{URL: away.URL}); err == nil {
		t.Fatal("registered a worker whose model probe was answered by another host")
	}
	if len(hits) != 0 {
		t.Fatalf("the other host was reached %d times", len(hits))
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Fatalf("%d workers registered, want none", n)
	}
}

// Defect: the gateway's own address was refused in its plain forms only; 127.1, 2130706433,
// 0x7f000001 and LOCALHOST. were registered (201). Every spelling a dialer may read as a
// listener of the gateway is refused through the admin API, before any probe.
func TestRegisterRefusesSelfInEverySpelling(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	ln, err := net.Listen("tcp", "127.0.0.1:0") // nothing answers: only the address can tell
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	g.ListeningOn("127.0.0.1:" + port)
	for _, h := range []string{"127.1", "127.0.1", "2130706433", "0x7f000001", "0X7F.1", "0177.0.0.1", "0177.1",
		"127.0.0.1.", "LOCALHOST.", "LocalHost", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "127.00.00.01"} {
		resp, raw := adminDo(t, g, "POST", "/workers", `{"url":"http://`+h+`:`+port+`","model_id":"m"}`, "")
		if resp.StatusCode != http.StatusConflict {
			t.Errorf("%s: %d %s, want 409", h, resp.StatusCode, raw)
		}
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Fatalf("%d workers registered, want none", n)
	}
	// A worker in a legacy spelling is registered at the address the checks read, and probed there.
	f := newFakeWorker(t, "m")
	_, fport, _ := net.SplitHostPort(strings.TrimPrefix(f.URL, "http://"))
	w, err := g.Register(context.Background(), AddWorkerRequest{URL: "http://0x7f.1:" + fport})
	if err != nil || w.URL.Host != "127.0.0.1:"+fport {
		t.Fatalf("registering the fake worker as 0x7f.1: %v (url %v), want it at 127.0.0.1", err, w)
	}
}

// An allow-list matches an address in any spelling as that address: 0x0a000001 is in
// 10.0.0.0/8, and 127.1 is not, whatever the rules' own spelling.
func TestAllowedWorkerHostsReadEverySpelling(t *testing.T) {
	h, err := parseHostRules([]string{"0x0a000000/8", "192.168.1", "Workers.Example."})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"10.0.0.1": true, "0x0a000001": true, "167772161": true, "::ffff:10.0.0.1": true, "10.1.": true,
		"192.168.0.1": true, "192.168.1": true, "workers.example": true, "WORKERS.EXAMPLE.": true,
		"127.1": false, "2130706433": false, "11.0.0.1": false, "192.168.0.2": false, "x.workers.example": false,
	} {
		if got := h.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
}
