package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/policy"
)

// warmRunSummary runs small tenant contexts on 3 engines of 8 slots, adds one at 30 s (and, when
// removeAt > 0, removes it again then), and returns the run with warming as given.
func warmRunSummary(t *testing.T, warm policy.WarmConfig, removeAt time.Duration) bench.Summary {
	t.Helper()
	fo := []bench.Change{{At: 30 * time.Second}}
	if removeAt > 0 {
		fo = append(fo, bench.Change{At: removeAt, Remove: true, Arg: "3"})
	}
	w := (&bench.LongContext{Seed: 1, Tenants: 12, ContextWords: 600, QuestionMin: 4, QuestionMax: 8, OutputTokens: 16}).Init()
	sched, err := bench.NewSchedule(w, bench.Arrivals{Rate: 12}, bench.Limits{Duration: 60 * time.Second}, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engines: 3, Policy: "cache_aware_hash", Seed: 1, Failover: fo, Timeline: 5 * time.Second,
		Engine: engine.Config{MaxRunning: 8}, Warm: warm}
	sum, err := Run(context.Background(), cfg, sched)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// addedRequests is the requests engine-3 answered.
func addedRequests(s bench.Summary) int {
	n := 0
	for _, p := range s.Timeline {
		n += p.Workers["engine-3"].Requests
	}
	return n
}

// TestWarmAddedEngine: unwarmed, an engine added to a fleet whose tenants are all cached
// elsewhere takes no request; warmed, it is sent the hot contexts (which are no client's
// requests), holds them, and takes hits; warming does not change the client's figures' errors.
func TestWarmAddedEngine(t *testing.T) {
	cold := warmRunSummary(t, policy.WarmConfig{}, 0)
	warm := warmRunSummary(t, policy.WarmConfig{Prefixes: 6}, 0)
	// Unwarmed, the added engine takes only what its idle queue wins over the holders' cached
	// prefill (the cost model sends it a miss when that is faster); warmed, it takes hits too.
	if cold.Warm != nil || addedRequests(cold) >= addedRequests(warm) {
		t.Fatalf("unwarmed: warm stats %v, added engine took %d requests (warmed %d); want none and fewer", cold.Warm, addedRequests(cold), addedRequests(warm))
	}
	if warm.Warm == nil || warm.Warm.Sent != 6 || warm.Warm.Recorded != 6 || warm.Warm.Failed != 0 {
		t.Fatalf("warm stats %+v, want 6 sent and recorded", warm.Warm)
	}
	if warm.OK != cold.OK || warm.Errors != 0 {
		t.Fatalf("warmed run: %d ok %d errors, want the unwarmed run's %d ok and none (warm requests are not clients')", warm.OK, warm.Errors, cold.OK)
	}
	if n := addedRequests(warm); n == 0 {
		t.Fatal("the warmed engine took no request")
	}
	var hitTokens, promptTokens int64
	for _, p := range warm.Timeline {
		hitTokens += p.Workers["engine-3"].CachedTokens
		promptTokens += p.Workers["engine-3"].PromptTokens
	}
	if float64(hitTokens) < 0.8*float64(promptTokens) {
		t.Fatalf("the warmed engine's hit rate %d/%d, want its requests to be hits", hitTokens, promptTokens)
	}
}

// TestWarmEngineRemovedRecordsNothing: an engine removed while its warm-up runs gets nothing
// recorded (each replica's tree forgot it), and every warm request counts as failed.
func TestWarmEngineRemovedRecordsNothing(t *testing.T) {
	s := warmRunSummary(t, policy.WarmConfig{Prefixes: 6, Concurrency: 1}, 30*time.Second+50*time.Millisecond)
	if s.Warm == nil || s.Warm.Recorded != 0 || s.Warm.Failed == 0 || s.Warm.Sent > 6 {
		t.Fatalf("warm stats %+v, want nothing recorded and failures counted", s.Warm)
	}
	if addedRequests(s) != 0 || s.Errors != 0 {
		t.Fatalf("the removed engine took %d requests, %d errors; want 0 and 0", addedRequests(s), s.Errors)
	}
}
