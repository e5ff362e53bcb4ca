package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// replica is one gateway of a multi-gateway test: its own registry, policies and counters.
type replica struct {
	s     *Server
	srv   *httptest.Server
	admin *httptest.Server
	mon   *loadmon.Monitor
}

// newReplica is a replica over the workers at urls, on the in-memory network mn (nil: loopback).
func newReplica(t *testing.T, mn *testutil.MemNet, global bool, pcfg policy.Config, urls []string) *replica {
	t.Helper()
	reg := worker.NewRegistry()
	r := &replica{}
	cfg := Config{Logger: slog.New(slog.DiscardHandler)}
	mcfg := loadmon.Config{Interval: 40 * time.Millisecond, Mode: loadmon.ModeScaled}
	if mn != nil {
		cfg.Proxy.Transport, mcfg.Transport = mn.Transport(), mn.Transport()
	}
	var loads LoadSource
	if global {
		r.mon = loadmon.New(reg, mcfg)
		pcfg.Loads, loads = r.mon, r.mon
	}
	router := newRouter(t, "cache_aware", pcfg)
	r.s = New(cfg, reg, router, loads)
	t.Cleanup(r.s.Stop)
	for _, u := range urls {
		if _, err := r.s.Register(context.Background(), AddWorkerRequest{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	if r.mon != nil {
		r.mon.PollOnce(context.Background())
		r.mon.Start(context.Background())
		t.Cleanup(r.mon.Stop)
	}
	r.srv = newServerOn(mn, r.s.Handler())
	t.Cleanup(r.srv.Close)
	r.admin = newServerOn(mn, r.s.AdminHandler())
	t.Cleanup(r.admin.Close)
	return r
}

// slowShare runs two gateways, each taking half of a closed-loop load of prompts that share one
// prefix, over four engines of which engine 0 (which holds the prefix first) is slow. It returns
// the share of requests that engine 0 served. It runs in a synctest bubble on an in-memory
// network: the engines' decode steps and the monitor's polls are on the bubble's clock, so the
// share does not depend on how loaded the machine is, and the run takes no real time waiting.
func slowShare(t *testing.T, global bool) (share float64) {
	t.Run(map[bool]string{false: "local", true: "global"}[global], func(t *testing.T) {
		testutil.InBubble(t, func(t *testing.T, mn *testutil.MemNet) { share = slowShareIn(t, mn, global) })
	})
	return share
}

func slowShareIn(t *testing.T, mn *testutil.MemNet, global bool) float64 {
	slow := sim.NewServer(sim.Config{Model: "m", Engine: engine.Config{MaxRunning: 2, DecodeBase: 25 * time.Millisecond}})
	t.Cleanup(slow.Close)
	urls := []string{}
	for i := 0; i < 4; i++ {
		var h http.Handler = slow
		if i > 0 {
			fast := sim.NewServer(sim.Config{Model: "m"})
			t.Cleanup(fast.Close)
			h = fast
		}
		srv := mn.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	client := mn.Client()
	pcfg := policy.DefaultConfig()
	// Each gateway alone sees about 6 requests on the slow engine, below the threshold; the
	// engine itself reports the 12 that both gateways put there.
	pcfg.CacheAware.BalanceAbsThreshold = 8
	reps := []*replica{newReplica(t, mn, global, pcfg, urls), newReplica(t, mn, global, pcfg, urls)}
	prefix := strings.Repeat("You are a careful assistant who answers in one short sentence. ", 8)
	var wg sync.WaitGroup
	const conc, perWorker = 6, 8
	for ri, r := range reps {
		for g := 0; g < conc; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perWorker; i++ {
					body := fmt.Sprintf(`{"model":"m","max_tokens":6,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d-%d-%d"}]}`, prefix, ri, g, i)
					testutil.PostOKVia(t, client, r.srv.URL+"/v1/chat/completions", "", body)
				}
			}()
		}
	}
	wg.Wait()
	var onSlow, total int64
	for _, r := range reps {
		for i, w := range r.s.reg.View().All {
			total += w.Processed()
			if i == 0 {
				onSlow += w.Processed()
			}
		}
	}
	return float64(onSlow) / float64(total)
}

// TestGlobalLoadShedsSlowEngine is the two-gateway test of global load: with the load monitor
// both gateways see the slow engine's whole backlog and shed it; with local load alone each sees
// only its own half and keeps feeding it.
func TestGlobalLoadShedsSlowEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-gateway load test")
	}
	local := slowShare(t, false)
	global := slowShare(t, true)
	t.Logf("share of requests on the slow engine: local load %.2f, global load %.2f", local, global)
	if local < 0.8 {
		t.Errorf("local-only gateways sent %.2f to the slow engine; the test expects them to keep feeding it", local)
	}
	if global > local-0.25 {
		t.Errorf("global load sent %.2f to the slow engine against %.2f with local load; want at least 0.25 less", global, local)
	}
}

// TestGetLoads shows the monitor's rows: a fresh entry for a polled worker and the effective load.
func TestGetLoads(t *testing.T) {
	eng := sim.NewServer(sim.Config{Model: "m"})
	t.Cleanup(eng.Close)
	es := httptest.NewServer(eng)
	t.Cleanup(es.Close)
	for _, global := range []bool{true, false} {
		r := newReplica(t, nil, global, policy.DefaultConfig(), []string{es.URL})
		resp, err := http.Get(r.admin.URL + "/get_loads")
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Monitor bool                 `json:"load_monitor"`
			Workers []loadmon.WorkerLoad `json:"workers"`
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if body.Monitor != global || len(body.Workers) != 1 || body.Workers[0].URL != es.URL {
			t.Fatalf("global=%v: %+v", global, body)
		}
		if got := body.Workers[0]; global && (!got.Fresh || got.Entry == nil || got.Entry.Report.MaxTokens == 0) {
			t.Errorf("monitored worker row %+v lacks a fresh entry", got)
		}
	}
}
