package gateway

import (
	"github.com/kvgate/kvgate/internal/netaddr"

	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// adminRaw sends one admin request with the given Host and Origin ("" = no Origin header).
func adminRaw(t *testing.T, g *testGateway, method, path, host, origin, body, key string) int {
	t.Helper()
	req := adminRequest(g, method, path, body, key)
	req.Host = host
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode >= 400 {
		decodeError(t, resp) // every refusal is in the OpenAI shape
	} else {
		resp.Body.Close()
	}
	return resp.StatusCode
}

// A DNS-rebound page (Host and Origin evil.example, a JSON body) must not drive the keyless
// admin plane: before the guard, this registered the worker (201).
func TestAdminRebindingRefused(t *testing.T) {
	g := newTestGateway(t, Config{}, "round_robin")
	f := newFakeWorker(t, "m")
	port := g.admin.Listener.Addr().(*net.TCPAddr).Port
	body := `{"url":"` + f.URL + `"}`
	if got := adminRaw(t, g, "POST", "/workers", "evil.example:"+strconv.Itoa(port), "http://evil.example:"+strconv.Itoa(port), body, ""); got != http.StatusMisdirectedRequest {
		t.Fatalf("rebound registration answered %d, want 421", got)
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Fatalf("a rebound request registered %d workers", n)
	}
	cases := []struct {
		name, method, path, host, origin string
		want                             int
	}{
		{"foreign host, no origin", "GET", "/workers", "evil.example", "", 421},
		{"foreign host on loopback port", "GET", "/get_loads", "evil.example:" + strconv.Itoa(port), "", 421},
		{"name under localhost", "GET", "/workers", "evil.localhost", "", 421},
		{"loopback host, foreign origin", "GET", "/workers", "127.0.0.1:" + strconv.Itoa(port), "http://evil.example", 403},
		{"loopback host, null origin", "GET", "/workers", "localhost", "null", 403},
		{"loopback host, origin with credentials", "GET", "/workers", "localhost", "http://a@127.0.0.1", 403},
		{"127.0.0.1", "GET", "/workers", "127.0.0.1:" + strconv.Itoa(port), "", 200},
		{"localhost", "GET", "/workers", "localhost:" + strconv.Itoa(port), "", 200},
		{"LOCALHOST.", "GET", "/workers", "LOCALHOST.", "", 200},
		{"127/8", "GET", "/workers", "127.9.9.9", "", 200},
		{"::1", "GET", "/workers", "[::1]:" + strconv.Itoa(port), "", 200},
		{"loopback origin", "GET", "/workers", "localhost", "http://localhost:3000", 200},
		{"v6 loopback origin", "GET", "/workers", "localhost", "https://[::1]", 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := adminRaw(t, g, c.method, c.path, c.host, c.origin, "", ""); got != c.want {
				t.Fatalf("answered %d, want %d", got, c.want)
			}
		})
	}
	if loopbackHost("") {
		t.Error("an absent Host (HTTP/1.0) passed as loopback")
	}
	// From loopback the same registration goes through.
	if got := adminRaw(t, g, "POST", "/workers", "127.0.0.1:"+strconv.Itoa(port), "", body, ""); got != http.StatusCreated {
		t.Fatalf("loopback registration answered %d, want 201", got)
	}
}

// With an admin key the key decides, whatever the Host: a browser cannot attach the key to a
// rebound request, and an admin plane behind a Service or an ingress is reached by other names.
func TestAdminKeyDecidesOverHost(t *testing.T) {
	g := newTestGateway(t, Config{AdminKey: "adm"}, "round_robin")
	if got := adminRaw(t, g, "GET", "/workers", "kvgate-admin.svc", "http://console.example", "", "adm"); got != 200 {
		t.Fatalf("with the key: %d, want 200", got)
	}
	if got := adminRaw(t, g, "GET", "/workers", "127.0.0.1", "", "", ""); got != 401 {
		t.Fatalf("loopback without the key: %d, want 401", got)
	}
}

// FuzzLoopbackHost holds loopbackHost to an oracle built on net.ParseIP and netaddr, and loopbackOrigin to
// loopbackHost.
func FuzzLoopbackHost(f *testing.F) {
	for _, s := range []string{"localhost", "localhost:1", "127.0.0.1", "[::1]:80", "::1", "evil.example", "127.1", "[::ffff:127.0.0.1]", "0:0:0:0:0:0:0:1", "fe80::1%lo", "LOCALHOST.:9", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got := loopbackHost(h)
		host := h
		if x, _, err := net.SplitHostPort(h); err == nil {
			host = x
		}
		host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
		ip := net.ParseIP(host)
		// A legacy spelling (127.1, 0x7f000001) is loopback too: netaddr holds those to its own
		// oracle (FuzzAddrSpellings).
		a, legacy := netaddr.Addr(host)
		want := strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback() || legacy && a.IsLoopback()) && !strings.Contains(host, "%")
		if got && !want {
			t.Fatalf("loopbackHost(%q) = true; the oracle says %q is not loopback", h, host)
		}
		if o := "http://" + h; loopbackOrigin(o) {
			u, _ := url.Parse(o)
			if !loopbackHost(u.Host) {
				t.Fatalf("loopbackOrigin(%q) without a loopback host", o)
			}
		}
	})
}
