package policy

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
)

// blindPeers is a sync plane of n live peers that have sent nothing (that has arrived).
type blindPeers struct{ n int }

func (blindPeers) Active() bool { return true }
func (p blindPeers) Peers() int { return p.n }
func (blindPeers) SentSinceAll(_ []string, _ []time.Time, tok, req []float64) {
	clear(tok)
	clear(req)
}
func (blindPeers) Chain(dst []uint64, _ string) ([]uint64, uint64)                { return dst, 0 }
func (blindPeers) PlacedChain(string, []uint64, uint64, int, []string, []int)     {}
func (blindPeers) DecidedChain(string, string, []uint64, uint64, string, float64) {}

// TestBlindTermMirrorsTheReplicasOwnBurst: behind 3 live peers, two idle engines. A prompt of
// 1,000 tokens goes to one; half a millisecond later (inside the 2 ms window, before any peer's
// decision could arrive) the first engine's S is its own 1,000 tokens plus 3 × 1,000 the peers
// probably sent it blind (sb=3000), and the second prompt goes to the other engine. Past the
// window the term is 0; with the window 0 it never counts.
func TestBlindTermMirrorsTheReplicasOwnBurst(t *testing.T) {
	for _, window := range []float64{0.002, 0} {
		polled := time.Unix(2000, 0)
		ws := cahWorkers(t, 2)
		reports := idReports{}
		for _, w := range ws {
			reports[w.ID] = loadmon.Report{HasUncachedTokens: true, HasTokenData: true, PolledAt: polled, Replicas: 1}
		}
		costClock.t = polled
		cfg := DefaultConfig()
		cfg.Loads, cfg.NoBackground, cfg.Now, cfg.Peers = reports, true, costClock.now, blindPeers{n: 3}
		cfg.Cost.BlindWindow = window
		pol, err := New("least_load", cfg)
		if err != nil {
			t.Fatal(err)
		}
		pick := func(text string) (string, Decision) {
			req := &Request{Model: "m", Text: text, PromptBytes: 4000}
			w := Choose(context.Background(), pol, ws, req)
			t.Cleanup(w.Acquire())
			return w.ID, req.Decision
		}
		costClock.advance(time.Millisecond)
		first, _ := pick("the first prompt")
		costClock.advance(500 * time.Microsecond)
		second, d := pick("the second prompt")
		onFirst := d.Chosen
		if second != first {
			onFirst = d.RunnerUp
		}
		wantBlind := 0.0
		if window > 0 {
			wantBlind = 3000
			if second == first {
				t.Fatalf("window %v: the second prompt of a burst followed the first to %s (%+v)", window, first, d)
			}
		}
		if onFirst.Worker != first || math.Abs(onFirst.Blind-wantBlind) > 1e-9 || math.Abs(onFirst.Sent-1000-wantBlind) > 20 {
			t.Fatalf("window %v: the first engine's terms %+v, want S = 1000 + %v blind (less the 12 tokens prefilled since the report)", window, onFirst, wantBlind)
		}
		if hasSB := strings.Contains(onFirst.String(), " sb=3000"); hasSB != (window > 0) {
			t.Fatalf("window %v: audit terms %q, sb= shown %v", window, onFirst.String(), hasSB)
		}
		costClock.advance(3 * time.Millisecond)
		if _, d := pick("a later prompt"); d.Chosen.Blind != 0 || d.RunnerUp.Blind != 0 {
			t.Fatalf("window %v: blind term past the window: %v and %v, want 0", window, d.Chosen.Blind, d.RunnerUp.Blind)
		}
	}
}

// TestBurstRateCountsDecisionsWithinTheWindow: decisions at 0, 0.5 ms and 5 ms with a 2 ms
// window see 0, 1 and 0 earlier ones; the mean over 2 decisions moves 0 → 0.5 → 0.25.
func TestBurstRateCountsDecisionsWithinTheWindow(t *testing.T) {
	var b burstRate
	t0 := time.Unix(3000, 0)
	for _, step := range []struct {
		at   time.Duration
		want float64
	}{{0, 0}, {500 * time.Microsecond, 0.5}, {5 * time.Millisecond, 0.25}} {
		b.add(t0.Add(step.at), 0.002, 2)
		if math.Abs(b.mean-step.want) > 1e-12 {
			t.Fatalf("after a decision at %v: mean %v, want %v", step.at, b.mean, step.want)
		}
	}
}

func TestBlindWindowBounds(t *testing.T) {
	for _, v := range []float64{-0.001, 11, math.NaN()} {
		c := DefaultCostConfig()
		c.BlindWindow = v
		if c.validate() == nil {
			t.Fatalf("blind window %v accepted", v)
		}
	}
}
