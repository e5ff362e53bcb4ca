package policy

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestStepTermArithmetic: two engines of 10 running requests each, the fleet generating 1,000
// tokens a second per engine (a decode step lasts 10 ms, 11 ms with one more request), prefill at
// 8,000 tokens a second (the default μ), so a step hides 88 tokens of prefill under its decode.
// 50 ms after the report a prompt of P tokens is sent to one engine (the report is old enough
// that S has drained: nothing of it is queued); 1 ms later the same prompt is decided again.
// With 80-token prompts the second one's prefill (with the first's, 160 tokens, 20 ms) outlasts
// the 11 ms step by 9 ms, which the first prompt waits for its first token: K = 1 × 9 ms, and
// the second prompt goes to the other engine, where without K the engines tie (D differs by
// 1 ms, inside ε) and it follows the first. With 40-token prompts (80 tokens, 10 ms) the step
// hides both: K = 0. One step later the first send no longer counts. Behind 2 replicas the
// send counts once (this replica's own; D = 12 ms, the report's replica estimate scaling the
// send in D): K = 1 × (20 − 12) ms.
func TestStepTermArithmetic(t *testing.T) {
	for _, tt := range []struct {
		on             bool
		prompt         float64 // tokens
		replicas       float64
		delayShare     float64
		same           bool    // the second prompt follows the first
		wantK, wantDec float64 // K and D of the first engine at the second decision, seconds
	}{
		{false, 80, 1, 1, true, 0, 0.011},
		{true, 80, 1, 1, false, 0.009, 0.011},
		{true, 40, 1, 1, true, 0, 0.011},
		{true, 80, 2, 1, false, 0.008, 0.012},
		{true, 80, 1, 0, true, 0, 0.011}, // DelayShare 0: the greedy cost has no delay to others
	} {
		t.Run(fmt.Sprint(tt.on, tt.prompt, tt.replicas, tt.delayShare), func(t *testing.T) {
			ws, reports := tenRunning(t, time.Unix(1000, 0), 0, tt.replicas)
			p := newCostPolicy(t, "least_load", nil, reports)
			p.sc.cfg.StepDelay, p.sc.cfg.DelayShare = tt.on, tt.delayShare
			pick := samePrompt(t, p, ws, "the same prompt", int(tt.prompt*4))
			costClock.advance(50 * time.Millisecond)
			first, onFirst := pickedTwice(t, pick, time.Millisecond, tt.same)
			if onFirst.Worker != first || math.Abs(onFirst.Decode-tt.wantDec) > 1e-12 || onFirst.Sent != 0 || onFirst.Rate != 8000 {
				t.Fatalf("terms of the first engine %+v, want D %v s, S 0, μ 8000", onFirst, tt.wantDec)
			}
			if math.Abs(onFirst.Step-tt.wantK) > 1e-12 {
				t.Fatalf("K of the first engine %v, want %v (%+v)", onFirst.Step, tt.wantK, onFirst)
			}
			if tt.wantK > 0 {
				// K by its formula from the recorded n, X, μ, D and u = P.
				n, x, u := onFirst.StepSent, onFirst.StepTokens, onFirst.Prompt
				if n != 1 || x != tt.prompt {
					t.Fatalf("n = %v, X = %v, want 1 and %v", n, x, tt.prompt)
				}
				want := n * (max((x+u)/8000-onFirst.Decode, 0) - max(x/8000-onFirst.Decode, 0))
				if math.Abs(onFirst.Step-want) > 1e-12 {
					t.Fatalf("K %v, want n × the step's lengthening %v", onFirst.Step, want)
				}
			}
			other := formula(onFirst.Queued, onFirst.Sent, onFirst.Prompt, onFirst.Cached, onFirst.Behind, onFirst.Rate, onFirst.PromptRate, onFirst.Decode)
			if math.Abs(onFirst.Cost-onFirst.Step-other) > 1e-12 || math.Abs(onFirst.Formula()-onFirst.Cost) > 1e-12 {
				t.Fatalf("cost %v less K is not the other terms' formula %v (%+v)", onFirst.Cost, other, onFirst)
			}
			if math.Abs(onFirst.TTFT()-other) > 1e-12 {
				t.Fatalf("TTFT %v counts K: it is the others' wait, not the prompt's", onFirst.TTFT())
			}
			if hasK := strings.Contains(onFirst.String(), " k="); hasK != (tt.wantK > 0) {
				t.Fatalf("audit terms %q: k= shown %v, want %v", onFirst.String(), hasK, tt.wantK > 0)
			}
			costClock.advance(13 * time.Millisecond) // past the step
			_, d := pick()
			if d.Chosen.Step != 0 || d.RunnerUp.Step != 0 {
				t.Fatalf("K a step later: %v and %v, want 0", d.Chosen.Step, d.RunnerUp.Step)
			}
		})
	}
}

// TestStepTermNaN: a hostile report whose numbers make K NaN prices the worker at +Inf.
func TestStepTermNaN(t *testing.T) {
	tm := Terms{StepSent: 1, StepTokens: 100, Prompt: 100, Rate: 8000, Decode: math.NaN()}
	if k := tm.stepDelay(); !math.IsInf(k, 1) {
		t.Fatalf("K with D NaN: %v, want +Inf", k)
	}
}

// TestStepTermChunk: a prompt lengthens the step the requests before it complete in by its part
// of one prefill chunk at most. The step carries 1,500 of 2,048 tokens (11 ms of decode, 8,000
// tokens/s): a 1,500-token prompt adds its first 548 tokens, 256 − 187.5 = 68.5 ms; a full
// chunk takes none of it (K = 0), and the config's chunk sets the room.
func TestStepTermChunk(t *testing.T) {
	for _, tt := range []struct {
		carried, room, want float64
	}{{1500, 548, 0.0685}, {2048, 0, 0}} {
		tm := Terms{StepSent: 1, StepTokens: tt.carried, StepRoom: tt.room, Prompt: 1500, Rate: 8000, Decode: 0.011}
		if k := tm.stepDelay(); math.Abs(k-tt.want) > 1e-12 {
			t.Fatalf("K with %v tokens carried: %v, want %v", tt.carried, k, tt.want)
		}
	}
	c := DefaultCostConfig()
	if c.PrefillChunk != 2048 || (CostConfig{TieShare: 0.1}).withDefaults().PrefillChunk != 2048 {
		t.Fatalf("prefill chunk default %v", c.PrefillChunk)
	}
	for _, v := range []float64{-1, 0.5, 2e7, math.NaN()} {
		c.PrefillChunk = v
		if c.validate() == nil {
			t.Fatalf("prefill chunk %v accepted", v)
		}
	}
}
