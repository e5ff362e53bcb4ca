package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestQueuedSendsAtTheBoundary: two `kvgate sim` engines, polled once with nothing queued; the
// policy's clock then reads 500 ms later, when S takes 4,000 tokens (500 ms at the default 8,000
// tokens/s) as prefilled since the report. Two prompts of about 800 tokens (P, in bytes ÷ 4) are
// sent at that instant. With the queued-sends term the second prompt's x-kvgate-cost headers show
// the first engine holding all of the first prompt (s = u = P) and it goes to the other engine;
// without it S takes the prompt as prefilled already (s=0, no u=).
func TestQueuedSendsAtTheBoundary(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(strconv.FormatBool(on), func(t *testing.T) {
			reg := worker.NewRegistry()
			mon := loadmon.New(reg, loadmon.Config{Interval: time.Hour, Mode: loadmon.ModeScaled})
			var mu sync.Mutex
			var now time.Time
			pc := policy.DefaultConfig()
			pc.NoBackground, pc.Loads, pc.Cost.QueueSends = true, mon, on
			pc.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			cfg := Config{AuditHeaders: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			bearer := auditClient(&cfg)
			s := New(cfg, reg, newRouter(t, "cache_aware_hash", pc), mon)
			for range 2 {
				es := httptest.NewServer(sim.NewServer(sim.Config{Model: "m"}))
				t.Cleanup(es.Close)
				if _, err := s.Register(context.Background(), AddWorkerRequest{URL: es.URL}); err != nil {
					t.Fatal(err)
				}
			}
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(srv.Close)
			mon.PollOnce(context.Background())
			r, ok := mon.Report(reg.View().All[0])
			if !ok || !r.HasUncachedTokens || r.WaitingUncachedTokens != 0 {
				t.Fatalf("report %+v (fresh %v), want one with nothing queued", r, ok)
			}
			mu.Lock()
			now = r.PolledAt.Add(500 * time.Millisecond)
			mu.Unlock()
			post := func(c byte) http.Header {
				body := `{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat(string(c), 3200) + `"}`
				h, _ := testutil.MustPostOK(t, srv.URL+"/v1/completions", bearer, body)
				return h
			}
			first := field(post('a').Get(headerCost), "worker")
			h := post('b')
			terms := h.Get(headerCost)
			if field(terms, "worker") == first {
				if on {
					t.Fatalf("the second prompt followed the first (%q)", terms)
				}
			} else {
				terms = h.Get(headerCostRunnerUp)
			}
			wantS, wantU := "0", ""
			if on {
				wantS, wantU = field(terms, "p"), field(terms, "p") // its prompt, all of it uncached
			}
			if field(terms, "worker") != first || field(terms, "s") != wantS || field(terms, "u") != wantU {
				t.Fatalf("terms of the first engine %q, want s=%s and u=%q", terms, wantS, wantU)
			}
		})
	}
}

// field returns the value of name= in audit terms, "" when absent.
func field(terms, name string) string {
	for _, f := range strings.Fields(terms) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}
