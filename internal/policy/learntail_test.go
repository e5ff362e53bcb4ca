package policy

import (
	"context"
	"math"
	"testing"
)

// TestTheTailIsPredictedByWhatExplainsIt: prompts run far past their routing text, which the
// tree holds whole. In conversations, the engine holds each one's previous turn (the tail cached
// is what was sent before under the same routing text); under a shared opening that runs past
// the routing text, it holds that opening and nothing of what follows (a fixed number of
// tokens, whatever the prompt's length). Each time, after a warm-up, the prediction follows the
// engine to within 0.03 of the prompt, where F's median share alone errs by more.
func TestTheTailIsPredictedByWhatExplainsIt(t *testing.T) {
	const opening = 1000 // tokens of the shared opening past the routing text
	cases := []struct {
		name string
		// text is the routing text of conversation c; cached the tokens the engine
		// reports of a prompt of tokens tokens whose conversation's previous one had prev.
		text   func(c int) string
		cached func(tokens, prev int) int
	}{
		{"conversations", func(c int) string { return prompt(c, " the conversation so far") },
			func(_, prev int) int { return prev }}, // its first turn: nothing
		{"shared opening", func(int) string { return prompt(0, " the opening every prompt shares") },
			func(tokens, _ int) int { return len(prompt(0, " the opening every prompt shares"))/4 + opening }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := cahWorkers(t, 1)
			p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
			prev := map[int]int{}
			var errSum, shareErr float64
			n := 0
			for i := range 240 {
				c := i%6 + 6*(i/24)                      // 6 conversations at a time, of 4 turns each
				bytes := 8000 + 4000*(i/6%4) + 400*(i%6) // each conversation grows, turn by turn
				req := &Request{Text: tc.text(c), PromptBytes: bytes}
				w := Choose(context.Background(), p, ws, req)
				tokens := bytes / 4
				cached := min(tc.cached(tokens, prev[c]), tokens)
				if i >= 120 {
					share := float64(cached) / float64(tokens)
					errSum += math.Abs(req.Decision.Predicted - share)
					b := req.Decision.Basis
					shareErr += math.Abs((b.Routed+b.Tails[tailShare])/req.Decision.Chosen.Prompt - share)
					n++
				}
				p.Learn(req, Answer{Worker: w.ID, PromptTokens: tokens, CachedTokens: cached})
				prev[c] = tokens
			}
			if mae, fmae := errSum/float64(n), shareErr/float64(n); mae > 0.03 || fmae < mae+0.03 {
				t.Fatalf("MAE %.3f (F's median share alone %.3f): want ≤ 0.03, and well below F's", mae, fmae)
			}
		})
	}
}
