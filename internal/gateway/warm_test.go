package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// warmContext is tenant i's long shared context; its requests add a question to it.
func warmContext(i int) string {
	return fmt.Sprintf("Tenant %d contract. ", i) + strings.Repeat(fmt.Sprintf("clause %d of tenant %d applies. ", i, i), 20)
}

// warmGateway is a started gateway with warming on in front of worker a, which has served
// tenants' requests (three each), so the pool's tree holds their contexts. ended receives each
// warm-up's recorded count.
type warmGateway struct {
	*testGateway
	log   *testutil.SyncBuffer
	ended chan int
}

func newWarmGateway(t *testing.T, warm policy.WarmConfig, tenants int, a *fakeWorker) *warmGateway {
	t.Helper()
	return newWarmGatewayOn(t, nil, warm, tenants, a)
}

// newWarmGatewayOn is newWarmGateway on the in-memory network mn (nil: loopback). On mn the
// active health checks are off: their prober dials the real network, and a warm-up does not
// wait for them (a worker is ready once its registration's probe answered).
func newWarmGatewayOn(t *testing.T, mn *testutil.MemNet, warm policy.WarmConfig, tenants int, a *fakeWorker) *warmGateway {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	cfg := Config{Warm: warm, AuditHeaders: true, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cfg.Proxy.Retry = proxy.RetryConfig{MaxAttempts: 1}
	cfg.Proxy.RequestTimeout = 10 * time.Second
	cfg.Health.Disabled = mn != nil
	g := &warmGateway{testGateway: newTestGatewayOn(t, mn, cfg, "cache_aware", a), log: logs, ended: make(chan int, 8)}
	g.warm.ended = func(_ *worker.Worker, n int) { g.ended <- n }
	ctx, cancel := context.WithCancel(context.Background())
	g.Start(ctx)
	t.Cleanup(func() { g.Stop(); cancel() })
	for i := range tenants {
		for q := range 3 {
			body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4}`, warmContext(i)+fmt.Sprintf("Question %d?", q))
			resp := g.post(t, "/v1/completions", body)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("tenant %d: status %d", i, resp.StatusCode)
			}
		}
	}
	g.waitDone(t, 3*tenants)
	return g
}

// addWorker registers f through the admin API and returns its id.
func (g *warmGateway) addWorker(t *testing.T, f *fakeWorker, apiKey string) string {
	t.Helper()
	body := fmt.Sprintf(`{"url":%q,"api_key":%q}`, f.URL, apiKey)
	resp, err := g.client.Post(g.admin.URL+"/workers", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info WorkerInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("POST /workers: status %d, %v", resp.StatusCode, err)
	}
	return info.ID
}

// waitEnded returns the recorded count of the next warm-up to end.
func (g *warmGateway) waitEnded(t *testing.T) int {
	t.Helper()
	return testutil.Recv(t, g.ended, "the warm-up to end")
}

// sample returns the value of the series named exactly series (name and labels) in a scrape.
func sample(t *testing.T, scraped, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(scraped, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in the scrape", series)
	return 0
}

// warmCounts returns the warm-up metrics as Prometheus scrapes them.
func warmCounts(t *testing.T, g *warmGateway) (ok, failed, recorded float64) {
	t.Helper()
	m := scrape(t, g.testGateway)
	return sample(t, m, `kvgate_warm_requests_total{outcome="ok"}`), sample(t, m, `kvgate_warm_requests_total{outcome="failed"}`),
		sample(t, m, "kvgate_warm_prefixes_recorded_total")
}

// TestWarmOnJoin: a worker added through the admin API gets one one-token completion per hot
// context, with its own API key and the gateway's hop marker, before any client request; then
// it takes the hits of what it holds. The log line has counts, never prompt text.
func TestWarmOnJoin(t *testing.T) {
	a, c := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g := newWarmGateway(t, policy.WarmConfig{Prefixes: 8, Concurrency: 2}, 3, a)
	cID := g.addWorker(t, c, "key-of-c")
	if n := g.waitEnded(t); n != 3 {
		t.Fatalf("recorded %d prefixes, want the 3 tenants' contexts", n)
	}
	if w := g.reg.View().Get(cID); w.Warming() || !w.Available() {
		t.Fatal("the warmed worker is still held out of routing")
	}
	c.mu.Lock()
	bodies, headers := c.bodies, c.headers
	c.mu.Unlock()
	if len(bodies) != 3 {
		t.Fatalf("the new worker got %d requests, want 3 warm ones", len(bodies))
	}
	seen := map[int]bool{}
	for i, raw := range bodies {
		var b struct {
			Model     string `json:"model"`
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
			Stream    bool   `json:"stream"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		tenant := -1
		for k := range 3 {
			if strings.HasPrefix(b.Prompt, warmContext(k)) {
				tenant = k
			}
		}
		if tenant < 0 || b.Model != "m" || b.MaxTokens != 1 || b.Stream {
			t.Fatalf("warm request %s: want a tenant's context, model m, one token, not streamed", raw)
		}
		seen[tenant] = true
		if got := headers[i].Get("Authorization"); got != "Bearer key-of-c" {
			t.Fatalf("warm request Authorization %q, want the worker's own key", got)
		}
		if headers[i].Get(proxy.HopHeader) == "" {
			t.Fatal("warm request without the gateway's hop marker")
		}
	}
	if len(seen) != 3 {
		t.Fatalf("tenants warmed: %v, want all 3", seen)
	}
	if ok, failed, rec := warmCounts(t, g); ok != 3 || failed != 0 || rec != 3 {
		t.Fatalf("metrics ok %v failed %v recorded %v, want 3 0 3", ok, failed, rec)
	}
	if tok := sample(t, scrape(t, g.testGateway), "kvgate_warm_prompt_tokens_total"); tok < 3*float64(len(warmContext(0)))/4 {
		t.Fatalf("warm prompt tokens %v, want at least the three contexts' estimate", tok)
	}

	// Both idle: the least loaded holder is the one that processed fewer requests, the new one.
	resp := g.post(t, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, warmContext(1)+"A new question?"))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	g.waitDone(t, 1)
	if w, branch := resp.Header.Get("x-kvgate-worker"), resp.Header.Get("x-kvgate-route"); w != g.auditIDs.of(cID) || branch != "cache_aware/"+policy.BranchCacheHit {
		t.Fatalf("after warming: worker %s by %s, want a cache hit on the new worker %s", w, branch, cID)
	}

	logs := g.log.String()
	if !strings.Contains(logs, `msg="worker warmed"`) || !strings.Contains(logs, "prefixes=3") || !strings.Contains(logs, "recorded=3") {
		t.Fatalf("no warm-up log line with counts:\n%s", logs)
	}
	if strings.Contains(logs, "clause") || strings.Contains(logs, "contract") {
		t.Fatalf("prompt text in the log:\n%s", logs)
	}
}

// TestWarmBoundedAndCancelledOnDelete: at most Concurrency warm requests are in flight; removing
// the worker cancels them (the worker sees its requests end) and records nothing; Stop returns.
func TestWarmBoundedAndCancelledOnDelete(t *testing.T) {
	a, c := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	var inflight, peak atomic.Int32
	entered := make(chan struct{}, 16)
	c.setHandler(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		entered <- struct{}{}
		<-r.Context().Done() // hangs until the gateway gives up on it
	})
	g := newWarmGateway(t, policy.WarmConfig{Prefixes: 8, Concurrency: 2}, 5, a)
	id := g.addWorker(t, c, "")
	for range 2 {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("warm requests did not reach the new worker")
		}
	}
	if w := g.reg.View().Get(id); w == nil || !w.Warming() || w.Available() {
		t.Fatal("a worker being warmed is offered to the policies")
	}
	shown, err := http.Get(g.admin.URL + "/workers/" + id)
	if err != nil {
		t.Fatal(err)
	}
	var info WorkerInfo
	if err := json.NewDecoder(shown.Body).Decode(&info); err != nil || !info.Warming {
		t.Fatalf("GET /workers/{id} while warming: warming %v, %v", info.Warming, err)
	}
	shown.Body.Close()
	resp := g.post(t, "/v1/completions", `{"model":"m","prompt":"a prompt nobody sent before"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	g.waitDone(t, 1)
	if got := resp.Header.Get("x-kvgate-worker"); got == g.auditIDs.of(id) {
		t.Fatal("a client request went to the worker being warmed")
	}
	req, _ := http.NewRequest(http.MethodDelete, g.admin.URL+"/workers/"+id, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := g.waitEnded(t); n != 0 {
		t.Fatalf("recorded %d prefixes for a worker that left, want 0", n)
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak warm requests in flight %d, want the bound 2", p)
	}
	if sent := c.requests(); sent > 2 {
		t.Fatalf("%d warm requests sent, want none after the 2 in flight when the worker left", sent)
	}
	if ok, failed, rec := warmCounts(t, g); ok != 0 || failed != 2 || rec != 0 {
		t.Fatalf("metrics ok %v failed %v recorded %v, want 0 2 0", ok, failed, rec)
	}
	if sizes := g.router.Policies()[0].Policy.(policy.TreeReporter).TreeSizes(); sizes[id] != 0 {
		t.Fatalf("the tree holds %d characters for the removed worker", sizes[id])
	}
	stopped := make(chan struct{})
	go func() { g.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return: a warm-up goroutine is left")
	}
}

// TestWarmFailuresAndDeadline: warm requests the worker refuses, and those still unanswered at
// the warm-up's deadline, count as failed and are not recorded; Stop cancels a warm-up in
// progress.
//
// Each case runs in a synctest bubble on testutil.MemNet: the deadline ends the warm-up exactly
// its length after the join.
func TestWarmFailuresAndDeadline(t *testing.T) {
	inBubble := func(name string, f func(t *testing.T, mn *testutil.MemNet)) {
		t.Run(name, func(t *testing.T) {
			testutil.InBubble(t, f)
		})
	}
	inBubble("refused", func(t *testing.T, mn *testutil.MemNet) {
		a, c := newFakeWorkerOn(t, mn, "m"), newFakeWorkerOn(t, mn, "m")
		c.setHandler(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "overloaded", http.StatusInternalServerError)
		})
		g := newWarmGatewayOn(t, mn, policy.WarmConfig{Prefixes: 8}, 2, a)
		g.addWorker(t, c, "")
		if n := g.waitEnded(t); n != 0 {
			t.Fatalf("recorded %d, want 0", n)
		}
		if ok, failed, rec := warmCounts(t, g); ok != 0 || failed != 2 || rec != 0 {
			t.Fatalf("metrics ok %v failed %v recorded %v, want 0 2 0", ok, failed, rec)
		}
	})
	inBubble("deadline", func(t *testing.T, mn *testutil.MemNet) {
		const deadline = time.Second
		a, c := newFakeWorkerOn(t, mn, "m"), newFakeWorkerOn(t, mn, "m")
		var answered atomic.Int32
		c.setHandler(func(w http.ResponseWriter, r *http.Request) {
			if answered.Add(1) == 1 { // the first answers; the rest hang past the deadline
				defaultInference(w, r)
				return
			}
			<-r.Context().Done()
		})
		g := newWarmGatewayOn(t, mn, policy.WarmConfig{Prefixes: 8, Concurrency: 1, Timeout: deadline}, 3, a)
		start := time.Now()
		g.addWorker(t, c, "")
		if n := g.waitEnded(t); n != 1 {
			t.Fatalf("recorded %d, want the one answered before the deadline", n)
		}
		if took := time.Since(start); took != deadline {
			t.Errorf("the warm-up ended %v after the join, want its deadline %v", took, deadline)
		}
		if ok, failed, _ := warmCounts(t, g); ok != 1 || failed != 1 {
			t.Fatalf("metrics ok %v failed %v, want 1 and 1 (the third was never sent)", ok, failed)
		}
	})
	inBubble("stop", func(t *testing.T, mn *testutil.MemNet) {
		a, c := newFakeWorkerOn(t, mn, "m"), newFakeWorkerOn(t, mn, "m")
		entered := make(chan struct{}, 8)
		c.setHandler(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-r.Context().Done()
		})
		g := newWarmGatewayOn(t, mn, policy.WarmConfig{Prefixes: 8}, 2, a)
		g.addWorker(t, c, "")
		testutil.Recv(t, entered, "a warm request to reach the new worker")
		g.Stop()
		if n := g.waitEnded(t); n != 0 {
			t.Fatalf("recorded %d after Stop, want 0", n)
		}
	})
}

// TestWarmOffAndNothingHot: with warming off, or nothing reused yet, a joining worker gets no
// request from the gateway.
func TestWarmOffAndNothingHot(t *testing.T) {
	a, c := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g := newWarmGateway(t, policy.WarmConfig{}, 2, a)
	g.addWorker(t, c, "")
	a2, c2 := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g2 := newWarmGateway(t, policy.WarmConfig{Prefixes: 8}, 0, a2)
	g2.addWorker(t, c2, "")
	if n := g2.waitEnded(t); n != 0 {
		t.Fatalf("recorded %d with nothing hot", n)
	}
	if c.requests() != 0 || c2.requests() != 0 {
		t.Fatalf("joining workers got %d and %d requests, want none", c.requests(), c2.requests())
	}
	select {
	case <-g.ended:
		t.Fatal("a warm-up ran with warming off")
	default:
	}
}

// TestWarmTableEmptiesAfterWarmUps: every ended warm-up leaves the table, whatever its end.
func TestWarmTableEmptiesAfterWarmUps(t *testing.T) {
	a, c := newFakeWorker(t, "m"), newFakeWorker(t, "m")
	g := newWarmGateway(t, policy.WarmConfig{Prefixes: 8}, 2, a)
	g.addWorker(t, c, "")
	g.waitEnded(t)
	g.Stop() // waits for the warm-up goroutine, which forgets its run as it exits
	g.warm.mu.Lock()
	defer g.warm.mu.Unlock()
	if n := len(g.warm.runs); n != 0 {
		t.Fatalf("%d warm-ups left in the table", n)
	}
}
