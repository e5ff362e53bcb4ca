package policy

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestHerdTermArithmetic: two engines of 10 running requests each, the fleet generating 1,000
// tokens a second per engine (one decode step of the batch lasts 10 ms, 11 ms with one more). A
// prompt is sent to one of them; 1 ms later the same prompt is decided again. Without the herd
// term the engines tie (their costs differ by D's one request, 1 ms, inside ε) and the prompt's
// rendezvous hash sends it after the first; with HerdShare s the first engine is charged
// H = s × 1 request × its step, 11 ms × s, and the second prompt goes to the other engine. One
// step later the first send no longer counts.
func TestHerdTermArithmetic(t *testing.T) {
	polled := time.Unix(1000, 0)
	for _, tt := range []struct {
		share    float64
		same     bool    // the second prompt follows the first
		wantHerd float64 // H of the first engine at the second decision, seconds
	}{
		{0, true, 0},
		{1, false, 0.011},
		{0.5, false, 0.0055},
	} {
		t.Run(fmt.Sprint(tt.share), func(t *testing.T) {
			ws, reports := tenRunning(t, polled, 0, 1)
			p := newCostPolicy(t, "least_load", nil, reports)
			p.sc.cfg.HerdShare = tt.share
			pick := samePrompt(t, p, ws, "the same system prompt", 4)
			costClock.advance(time.Millisecond) // after the report: the engine has not seen it
			first, onFirst := pickedTwice(t, pick, time.Millisecond, tt.same)
			if onFirst.Worker != first || math.Abs(onFirst.Decode-0.011) > 1e-12 {
				t.Fatalf("terms of the first engine %+v, want D = 11 requests ÷ 1000 tokens/s", onFirst)
			}
			if want := tt.share * 1 * onFirst.Decode; math.Abs(onFirst.Herd-want) > 1e-12 || math.Abs(onFirst.Herd-tt.wantHerd) > 1e-12 {
				t.Fatalf("H of the first engine %v, want %v", onFirst.Herd, tt.wantHerd)
			}
			if got := onFirst.Cost - onFirst.Herd; math.Abs(got-formula(onFirst.Queued, onFirst.Sent, onFirst.Prompt, onFirst.Cached, onFirst.Behind, onFirst.Rate, onFirst.PromptRate, onFirst.Decode)) > 1e-12 {
				t.Fatalf("cost %v less H is not the other terms' formula (%+v)", onFirst.Cost, onFirst)
			}
			if hasH := strings.Contains(onFirst.String(), " h="); hasH != (tt.share > 0) {
				t.Fatalf("audit terms %q: h= shown %v, want %v", onFirst.String(), hasH, tt.share > 0)
			}
			// One step (12 ms) on, neither send is within the batch's current step.
			costClock.advance(12 * time.Millisecond)
			_, d := pick()
			if d.Chosen.Herd != 0 || d.RunnerUp.Herd != 0 {
				t.Fatalf("H a step later: %v and %v, want 0", d.Chosen.Herd, d.RunnerUp.Herd)
			}
		})
	}
}

func TestHerdShareBounds(t *testing.T) {
	for _, v := range []float64{-1, 101, math.NaN()} {
		c := DefaultCostConfig()
		c.HerdShare = v
		if c.validate() == nil {
			t.Fatalf("herd share %v accepted", v)
		}
	}
	c := DefaultCostConfig()
	c.HerdShare = 2
	if err := c.validate(); err != nil || c.withDefaults().HerdShare != 2 {
		t.Fatalf("herd share 2: %v, kept %v", err, c.withDefaults().HerdShare)
	}
}

// tenRunning returns two workers reported at polled with 10 running requests each, queued tokens
// of uncached prefill waiting, the fleet generating 1,000 tokens a second per engine (a decode step
// of 10 ms), behind replicas gateway replicas: the hand-built fleet of the herd, step and
// queued-sends tests.
func tenRunning(t *testing.T, polled time.Time, queued int64, replicas float64) ([]*worker.Worker, idReports) {
	ws := cahWorkers(t, 2)
	reports := idReports{}
	for _, w := range ws {
		reports[w.ID] = loadmon.Report{HasUncachedTokens: true, HasTokenData: true, Running: 10,
			WaitingUncachedTokens: queued, GenThroughput: 1000, PolledAt: polled, Replicas: replicas}
	}
	return ws, reports
}

// herdPeers is a sync plane whose peers sent two requests (no uncached tokens) to one worker
// since its report.
type herdPeers struct{ to string }

func (herdPeers) Active() bool { return true }
func (herdPeers) Peers() int   { return 1 }
func (p herdPeers) SentSinceAll(ws []string, _ []time.Time, tok, req []float64) {
	for i, w := range ws {
		tok[i], req[i] = 0, 0
		if w == p.to {
			req[i] = 2
		}
	}
}
func (herdPeers) Chain(dst []uint64, _ string) ([]uint64, uint64)                { return dst, 0 }
func (herdPeers) PlacedChain(string, []uint64, uint64, int, []string, []int)     {}
func (herdPeers) DecidedChain(string, string, []uint64, uint64, string, float64) {}

// TestHerdCountsThePeersSends: with replica sync, the requests the peers sent a worker since
// its report are n too: two peer sends on an engine of 10 running, 1,000 tokens/s, make D 12 ms
// and H = h × 2 × 12 ms.
func TestHerdCountsThePeersSends(t *testing.T) {
	polled := time.Unix(1000, 0)
	ws, reports := tenRunning(t, polled, 0, 1)
	costClock.t = polled
	cfg := DefaultConfig()
	cfg.Loads, cfg.NoBackground, cfg.Now, cfg.Peers = reports, true, costClock.now, herdPeers{to: ws[0].ID}
	cfg.Cost.HerdShare = 0.5
	pol, err := New("least_load", cfg)
	if err != nil {
		t.Fatal(err)
	}
	costClock.advance(time.Millisecond)
	req := &Request{Model: "m", Text: "a prompt", PromptBytes: 4}
	if got := Choose(context.Background(), pol, ws, req); got != ws[1] {
		t.Fatalf("picked %s, want the engine the peers did not send to (%+v)", got.ID, req.Decision)
	}
	d := req.Decision.RunnerUp
	if d.Worker != ws[0].ID || math.Abs(d.Decode-0.012) > 1e-12 || math.Abs(d.Herd-0.5*2*0.012) > 1e-12 {
		t.Fatalf("terms of the peers' engine %+v, want D 0.012 s and H 0.012 s", d)
	}
}

// samePrompt returns a pick of text (promptBytes long) by p among ws, each pick held in flight
// until the test ends (the engines have not reported it).
func samePrompt(t *testing.T, p Policy, ws []*worker.Worker, text string, promptBytes int) func() (string, Decision) {
	return func() (string, Decision) {
		req := &Request{Model: "m", Text: text, PromptBytes: promptBytes}
		w := Choose(context.Background(), p, ws, req)
		t.Cleanup(w.Acquire())
		return w.ID, req.Decision
	}
}

// pickedTwice picks, then picks again gap later, fails unless the second pick follows the first
// exactly when same, and returns the first engine and its terms at the second decision.
func pickedTwice(t *testing.T, pick func() (string, Decision), gap time.Duration, same bool) (string, Terms) {
	t.Helper()
	first, _ := pick()
	costClock.advance(gap)
	second, d := pick()
	if (second == first) != same {
		t.Fatalf("second prompt to %s after %s, want same=%v (decision %+v)", second, first, same, d)
	}
	if second != first {
		return first, d.RunnerUp
	}
	return first, d.Chosen
}
