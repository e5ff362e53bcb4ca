package policy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestCacheAwareReadsGlobalLoad: worker A reports a large backlog while this gateway has nothing
// in flight anywhere. A cache_aware built by the registry on the monitor must see the pool as
// imbalanced and pick B even though A holds the prompt's prefix; built on local load alone it
// keeps the affinity.
func TestCacheAwareReadsGlobalLoad(t *testing.T) {
	backlog := map[string]int{}
	serve := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"loads":[{"dp_rank":0,"num_running_reqs":%d,"num_waiting_reqs":0}]}`, backlog[name])
		}))
		t.Cleanup(s.Close)
		return s
	}
	backlog["a"] = 200
	a, b := serve("a"), serve("b")
	reg := worker.NewRegistry()
	var ws []*worker.Worker
	for _, s := range []*httptest.Server{a, b} {
		w, err := worker.New(worker.Spec{URL: s.URL, Models: []string{"m"}, Runtime: "sglang"}, worker.BreakerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		w.SetHealth(worker.Ready)
		reg.Add(w)
		ws = append(ws, w)
	}
	mon := loadmon.New(reg, loadmon.Config{})
	mon.PollOnce(context.Background())
	if r, ok := mon.Report(ws[0]); !ok || r.Backlog() != 200 {
		t.Fatalf("monitor report for A: %+v, %v", r, ok)
	}
	text := "You are a helpful assistant. Answer briefly. " + "question one"
	for _, tc := range []struct {
		name  string
		loads Loads
		want  *worker.Worker
	}{
		{"global load: imbalanced, B", mon, ws[1]},
		{"local load: affinity, A", nil, ws[0]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Loads, cfg.NoBackground = tc.loads, true
			r, err := NewRouter("cache_aware", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			p, _ := r.For("m", worker.Regular)
			p.(*CacheAware).tree.Insert(text, ws[0].ID) // A holds the prefix
			if ws[0].Inflight() != 0 || ws[1].Inflight() != 0 {
				t.Fatal("local counts must be idle")
			}
			if got := p.Pick(context.Background(), ws, &Request{Model: "m", Text: text + " and more"}); got != tc.want {
				t.Errorf("picked %s, want %s", got.Spec.URL, tc.want.Spec.URL)
			}
		})
	}
}
