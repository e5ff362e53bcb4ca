package bench

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/sim"
)

// TestLiveAgainstSim drives `kvgate sim`'s server in process and checks that the driver reports
// exactly the prompt and cached tokens the engine accounted for.
func TestLiveAgainstSim(t *testing.T) {
	for _, tm := range []engine.TimingModel{engine.TimingBatched, engine.TimingPerSlot} {
		t.Run(tm.String(), func(t *testing.T) { liveAgainstSim(t, tm) })
	}
}

func liveAgainstSim(t *testing.T, tm engine.TimingModel) {
	srv := sim.NewServer(sim.Config{Engine: engine.Config{Timing: tm}})
	defer srv.Close()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	w := NewSharedPrefix(4)
	w.Prefixes, w.OutputTokens = 2, 4
	w.Init()
	sched, err := NewSchedule(w, Arrivals{Concurrency: 2}, Limits{Requests: 24}, 1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunLive(context.Background(), LiveConfig{Target: hs.URL}, sched, "sim")
	if err != nil {
		t.Fatal(err)
	}
	s, l := res.Summary, srv.Load()
	if s.OK != 24 || s.Errors != 0 {
		t.Fatalf("ok %d errors %d %v", s.OK, s.Errors, s.ErrorKinds)
	}
	if s.PromptTokens != l.PromptTokens || s.CachedTokens != l.CachedTokens {
		t.Fatalf("driver saw prompt %d cached %d; engine counted prompt %d cached %d", s.PromptTokens, s.CachedTokens, l.PromptTokens, l.CachedTokens)
	}
	if s.CachedTokens == 0 || s.HitRate <= 0.2 {
		t.Fatalf("two shared prompts over 24 requests, yet hit rate %.3f", s.HitRate)
	}
	if s.OutTokSec <= 0 || s.TTFTP50 <= 0 || len(res.Warnings) != 0 {
		t.Fatalf("summary %+v warnings %v", s, res.Warnings)
	}
}
