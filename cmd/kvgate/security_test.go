package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Defect 8: YAML turned key-looking strings into numbers (0x1F became 31).
	yamlKeys := write("keys.yaml", "admin-key: 0x1F\napi-key:\n  - 0123\n  - 1e3\nworker-api-key: 0o17\n")
	keyFile := write("keys.txt", "# data-plane keys\nfile-key-1\n\n  file-key-2  \n")
	emptyFile := write("empty.txt", "# nothing\n")
	cases := []parseCase{
		{name: "defaults", check: func(t *testing.T, o *serveOptions) {
			if o.sec.adminHost != "127.0.0.1" || o.sec.adminPort != 30001 || o.gw.AdminOnDataPlane || len(o.gw.APIKeys) != 0 || o.gw.Proxy.ForwardClientAuth {
				t.Errorf("defaults: %+v", o.sec)
			}
			if l := o.gw.Limits; l.HeaderReadTimeout != 10*time.Second || l.BodyReadTimeout != time.Minute || l.IdleTimeout != 2*time.Minute || l.MaxHeaderBytes != 64<<10 || l.MaxUpstreamHeaderBytes != 64<<10 {
				t.Errorf("limits %+v", l)
			}
		}},
		{name: "yaml values as written", args: []string{"--config", yamlKeys}, check: func(t *testing.T, o *serveOptions) {
			if o.gw.AdminKey != "0x1F" || !reflect.DeepEqual(o.gw.APIKeys, []string{"0123", "1e3"}) || o.sec.workerAPIKey != "0o17" {
				t.Errorf("admin %q api %q worker %q", o.gw.AdminKey, o.gw.APIKeys, o.sec.workerAPIKey)
			}
		}},
		{name: "several keys", args: []string{"--api-key", "a", "--api-key", "b,c", "--api-key-file", keyFile}, check: func(t *testing.T, o *serveOptions) {
			if !reflect.DeepEqual(o.gw.APIKeys, []string{"a", "b", "c", "file-key-1", "file-key-2"}) {
				t.Errorf("keys %q", o.gw.APIKeys)
			}
		}},
		{name: "empty key file", args: []string{"--api-key-file", emptyFile}, wantErr: "holds no key"},
		{name: "admin beyond loopback needs a key", args: []string{"--admin-host", "0.0.0.0"}, wantErr: "not a loopback address"},
		{name: "admin beyond loopback with a key", args: []string{"--admin-host", "0.0.0.0", "--admin-key", "k"}, check: func(t *testing.T, o *serveOptions) {}},
		{name: "admin on the API port needs a key", args: []string{"--admin-on-api-port"}, wantErr: "admin key"},
		{name: "bad allowed host", args: []string{"--allowed-worker-hosts", "10.0.0.0/99"}, wantErr: "not a CIDR"},
		{name: "limits", args: []string{"--header-read-timeout", "2s", "--body-read-timeout", "3s", "--idle-timeout", "4s", "--max-header-bytes", "1000", "--max-upstream-header-bytes", "2000"},
			check: func(t *testing.T, o *serveOptions) {
				if l := o.gw.Limits; l.HeaderReadTimeout != 2*time.Second || l.BodyReadTimeout != 3*time.Second || l.IdleTimeout != 4*time.Second || l.MaxHeaderBytes != 1000 || l.MaxUpstreamHeaderBytes != 2000 {
					t.Errorf("limits %+v", l)
				}
			}},
	}
	runParseCases(t, cases)

	t.Run("environment", func(t *testing.T) {
		t.Setenv("KVGATE_API_KEYS", "e1,e2")
		t.Setenv("KVGATE_ADMIN_KEY", "env-admin")
		t.Setenv("KVGATE_WORKER_API_KEY", "env-worker")
		o, err := parseServe([]string{"--api-key", "f1", "--worker-urls", "http://a:1"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(o.gw.APIKeys, []string{"f1", "e1", "e2"}) || o.gw.AdminKey != "env-admin" || o.sec.workerAPIKey != "env-worker" {
			t.Errorf("keys %q admin %q worker %q", o.gw.APIKeys, o.gw.AdminKey, o.sec.workerAPIKey)
		}
	})
	t.Run("no key in -h", func(t *testing.T) {
		var out bytes.Buffer
		parseServe([]string{"--api-key", "visible-secret", "--admin-key", "visible-admin", "-h"}, &out)
		if strings.Contains(out.String(), "visible-") {
			t.Errorf("usage shows a key")
		}
	})
}

func TestWorkerCredentialsFromFlags(t *testing.T) {
	o, err := parseServe([]string{"--worker-urls", "http://a:1", "http://b:2", "--worker-api-key", "shared",
		"--worker-label", "api_key=own@http://b:2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	regs, err := registrations(o)
	if err != nil {
		t.Fatal(err)
	}
	if regs[0].APIKey != "shared" || regs[1].APIKey != "own" || regs[1].Labels["api_key"] != "" {
		t.Errorf("registrations %+v", regs)
	}
}

// TestServeAdminPlane runs serve with its defaults but free ports: the data plane has no admin
// routes, the admin plane on loopback has them, the start-up log says so and shows no key.
func TestServeAdminPlane(t *testing.T) {
	o, err := parseServe([]string{"--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "0", "--sim-workers", "1",
		"--api-key", "data-secret"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	addrs, stop := startServe(t, o, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	get := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := get("http://" + addrs.api + "/workers"); s != 404 {
		t.Errorf("GET /workers on the API port: %d", s)
	}
	if s := get("http://" + addrs.admin + "/workers"); s != 200 {
		t.Errorf("GET /workers on the admin port: %d", s)
	}
	text := logs.String()
	for _, want := range []string{"data plane", "clients with one of 1 API keys", "admin plane", "loopback", "metrics plane"} {
		if !strings.Contains(text, want) {
			t.Errorf("start-up log lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "data-secret") {
		t.Error("the log shows a key")
	}
}

// `kvgate serve --worker-urls` naming the gateway's own port: the worker is refused at once (its
// address is announced before the first registration attempt) and never retried, and the
// gateway serves with no worker.
func TestServeRefusesItselfAsWorker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	o, err := parseServe([]string{"--host", "127.0.0.1", "--port", port, "--prometheus-port", "0", "--admin-port", "0",
		"--worker-urls", "http://localhost:" + port}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	addrs, stop := startServe(t, o, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	resp, err := http.Get("http://" + addrs.admin + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Total int }
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if list.Total != 0 {
		t.Fatalf("%d workers registered, want none", list.Total)
	}
	if text := logs.String(); !strings.Contains(text, "worker not registered") || !strings.Contains(text, "own listeners") {
		t.Fatalf("no refusal logged:\n%s", text)
	}
}
