package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// adminRequest is a request to g's admin plane: a JSON body when body is not "", and the bearer
// key when key is not "".
func adminRequest(g *testGateway, method, path, body, key string) *http.Request {
	req, _ := http.NewRequest(method, g.admin.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return req
}

// adminDo sends one admin request and returns its answer with the body read.
func adminDo(t *testing.T, g *testGateway, method, path, body, key string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(adminRequest(g, method, path, body, key))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, raw
}

func TestWorkerAdminAPI(t *testing.T) {
	g := newTestGateway(t, Config{AdminKey: "adm"}, "round_robin")
	f := newFakeWorker(t, "learned-model")
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()

	cases := []struct {
		name   string
		method string
		path   string
		body   string
		key    string
		status int
		check  func(t *testing.T, raw []byte)
	}{
		{name: "no admin key", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `"}`, status: 401},
		{name: "bad url", method: "POST", path: "/workers", body: `{"url":"ftp://x"}`, key: "adm", status: 400},
		{name: "bad type", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `","worker_type":"both"}`, key: "adm", status: 400},
		{name: "bad policy label", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `","labels":{"policy":"nope"}}`, key: "adm", status: 400},
		{name: "unknown field", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `","colour":"red"}`, key: "adm", status: 400},
		{name: "unreachable", method: "POST", path: "/workers", body: `{"url":"` + dead.URL + `"}`, key: "adm", status: 502},
		{name: "add learns models", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `","runtime":"vllm"}`, key: "adm", status: 201,
			check: func(t *testing.T, raw []byte) {
				var w WorkerInfo
				json.Unmarshal(raw, &w)
				if len(w.Models) != 1 || w.Models[0] != "learned-model" || w.Health != "ready" || w.Runtime != "vllm" {
					t.Errorf("registered %+v", w)
				}
			}},
		{name: "duplicate", method: "POST", path: "/workers", body: `{"url":"` + f.URL + `/"}`, key: "adm", status: 409},
		{name: "list", method: "GET", path: "/workers", key: "adm", status: 200, check: func(t *testing.T, raw []byte) {
			var l struct{ Total int }
			json.Unmarshal(raw, &l)
			if l.Total != 1 {
				t.Errorf("list: %s", raw)
			}
		}},
		{name: "get unknown", method: "GET", path: "/workers/nope", key: "adm", status: 404},
		{name: "delete unknown", method: "DELETE", path: "/workers/nope", key: "adm", status: 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, raw := adminDo(t, g, tc.method, tc.path, tc.body, tc.key)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			if tc.check != nil {
				tc.check(t, raw)
			}
		})
	}
	id := g.reg.View().All[0].ID
	if resp, raw := adminDo(t, g, "GET", "/workers/"+id, "", "adm"); resp.StatusCode != 200 || !strings.Contains(string(raw), f.URL) {
		t.Errorf("get: %d %s", resp.StatusCode, raw)
	}
	if resp, _ := adminDo(t, g, "DELETE", "/workers/"+id, "", "adm"); resp.StatusCode != 200 {
		t.Errorf("delete: %d", resp.StatusCode)
	}
	if n := len(g.reg.View().All); n != 0 {
		t.Errorf("%d workers after delete", n)
	}
}

// TestDeleteDrains removes a worker while a request is on it: the request finishes, and no new
// request reaches the worker.
func TestDeleteDrains(t *testing.T) {
	a, b := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	arrived, release := a.hold(t)
	g := newTestGateway(t, Config{}, "round_robin", a, b)
	first := g.async(t.Context(), "/v1/completions", `{"model":"m","prompt":"x"}`)
	testutil.Recv(t, arrived, "the first request at the worker")
	aw := g.reg.View().All[0]
	if resp, _ := adminDo(t, g, "DELETE", "/workers/"+aw.ID, "", ""); resp.StatusCode != 200 {
		t.Fatal("delete failed")
	}
	for i := 0; i < 4; i++ {
		resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"x"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if a.requests() != 1 || b.requests() != 4 {
		t.Errorf("after delete: drained worker got %d requests, other %d; want 1 and 4", a.requests(), b.requests())
	}
	close(release)
	if s := answerStatus(t, first); s != 200 {
		t.Errorf("the in-flight request on the drained worker ended %d", s)
	}
	g.waitDone(t, 5) // the five completions, the first one's handler included (the DELETE went to the admin plane)
	if aw.Inflight() != 0 {
		t.Errorf("drained worker in flight %d", aw.Inflight())
	}
}

func TestMetricsExposition(t *testing.T) {
	f := newFakeWorker(t, "m")
	g := newTestGateway(t, Config{}, "round_robin", f)
	resp := g.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp = g.post(t, "/v1/chat/completions", `{"model":"zzz"}`)
	resp.Body.Close()
	g.waitDone(t, 2)
	ms := httptest.NewServer(g.MetricsHandler())
	defer ms.Close()
	mr, err := http.Get(ms.URL)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	wid := g.reg.View().All[0].ID
	for _, want := range []string{
		`kvgate_requests_total{model="m",route="/v1/chat/completions",status="200"} 1`,
		`kvgate_requests_total{model="",route="/v1/chat/completions",status="404"} 1`,
		`kvgate_ttft_seconds_count{model="m"} 1`,
		`kvgate_policy_selections_total{model="m",policy="round_robin",worker="` + wid + `"} 1`,
		`kvgate_worker_inflight{url="` + f.URL + `",worker="` + wid + `"} 0`,
		`kvgate_worker_health{state="ready",worker="` + wid + `"} 1`,
		`kvgate_request_duration_seconds_count{model="m",route="/v1/chat/completions"} 1`,
	} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
