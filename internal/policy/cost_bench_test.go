package policy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// monitoredFleet returns n ready workers behind one loopback server that answers every
// worker's /v1/loads with a different fresh report, and a real load monitor that has polled them
// all once; its clock is pinned to the poll, so the reports stay fresh however long a benchmark
// runs.
func monitoredFleet(b *testing.B, n int) ([]*worker.Worker, *loadmon.Monitor) {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/v1/loads") {
			http.NotFound(w, r)
			return
		}
		var i int
		fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/w"), "%d", &i)
		fmt.Fprintf(w, `{"loads":[{"num_running_reqs":%d,"num_waiting_reqs":%d,"num_waiting_uncached_tokens":%d,"token_usage":0.%02d,"gen_throughput":%d}]}`,
			4+i%8, i%3, 1000*(i%7), 10+i%50, 400+i%100)
	}))
	b.Cleanup(srv.Close)
	reg := worker.NewRegistry()
	ws := make([]*worker.Worker, n)
	for i := range ws {
		w, err := worker.New(worker.Spec{URL: fmt.Sprintf("%s/w%d", srv.URL, i), Runtime: "sglang", Models: []string{"m"}}, worker.BreakerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		if err := reg.Add(w); err != nil {
			b.Fatal(err)
		}
		ws[i] = w
	}
	now := time.Now()
	mon := loadmon.New(reg, loadmon.Config{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	b.Cleanup(mon.Stop)
	mon.PollOnce(context.Background())
	fresh := 0
	for _, w := range ws {
		if _, ok := mon.Report(w); ok {
			fresh++
		}
	}
	if fresh != n {
		b.Fatalf("%d of %d workers have a fresh report", fresh, n)
	}
	return ws, mon
}

// mooncakeTexts returns 2,048 Mooncake-like routing texts: one shared 2 KB opening and a 6 KB
// tail each, drawn from a fixed pool.
func mooncakeTexts() []string {
	r := rand.New(rand.NewPCG(14, 14))
	pool := benchPool(r, 8<<20)
	texts := make([]string, 2048)
	for i := range texts {
		off := r.IntN(len(pool) - 6144)
		texts[i] = pool[:2048] + pool[off:off+6144]
	}
	return texts
}

// BenchmarkDecisionWithMonitor times one decision of the cost-based policies against a real
// load monitor holding a fresh report for every worker, at 64 and 256 workers, beside
// round_robin's in the same run (targets: the default ≤ 20 µs at 64, ≤ 60 µs at 256). Prompts
// are Mooncake-like (one shared 2 KB opening, a 6 KB tail, then 8 KB more) on a tree that has
// seen each once; each decision cuts its routing text first, as the gateway does (RoutingText:
// the opening is shorter than 8 KiB, so it is the first 8 KiB).
//
//	go test -run XXX -bench DecisionWithMonitor ./internal/policy/
func BenchmarkDecisionWithMonitor(b *testing.B) {
	texts := mooncakeTexts()
	more := strings.Repeat("and then the prompt goes on. ", 8192/29+1)[:8192]
	for i := range texts {
		texts[i] += more
	}
	const past = 8192
	for _, n := range []int{64, 256} {
		ws, mon := monitoredFleet(b, n)
		for _, name := range []string{"round_robin", "least_load", "cache_aware_hash", "cache_aware"} {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.NoBackground, cfg.Loads = true, mon
				p, err := New(name, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if c, ok := p.(io.Closer); ok {
					defer c.Close()
				}
				for i := range texts {
					Choose(context.Background(), p, ws, &Request{Text: RoutingText(p, texts[i], false, past), PromptBytes: 40000})
				}
				if n := len(RoutingText(p, texts[0], false, past)); n != past {
					b.Fatalf("routing text of %d bytes, want the first %d: the decisions would differ from main's", n, past)
				}
				req := &Request{}
				i := 0
				b.ReportAllocs()
				for b.Loop() {
					*req = Request{Text: RoutingText(p, texts[i%len(texts)], false, past), PromptBytes: 40000}
					if Choose(context.Background(), p, ws, req) == nil {
						b.Fatal("no pick")
					}
					i++
				}
			})
		}
	}
}
