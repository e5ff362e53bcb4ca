package policy

import (
	"math"
	"testing"
)

// TestTheOwnersPartIsPredictedByThePromptsLength: behind several gateways, credited prompts of
// conversations: the short ones are first turns, which the owner does not hold, the long ones
// later turns, which it holds but for their newest 150 tokens. G's one share of the credit errs
// on both; the prediction by the prompt's length follows each to within 0.05 of the prompt.
func TestTheOwnersPartIsPredictedByThePromptsLength(t *testing.T) {
	p := newCostPolicy(t, "cache_aware_hash", nil, cahLoads{})
	var mae, gMAE float64
	n := 0
	for i := range 400 {
		prompt, held := 200, 0
		if i%2 == 1 {
			prompt, held = 4000, 4000-150
		}
		d := Decision{Worker: "w", HasPrediction: true, Chosen: Terms{Prompt: float64(prompt)}}
		d.Basis.Credit = float64(prompt)
		d.Predicted = p.ownerHeld(d.Basis.Credit) / float64(prompt)
		p.predictOwner(&d)
		if i >= 200 {
			share := float64(held) / float64(prompt)
			mae += math.Abs(d.Predicted - share)
			gMAE += math.Abs(d.Basis.Owners[ownerG]/float64(prompt) - share)
			n++
		}
		p.Learn(&Request{Decision: d}, Answer{Worker: "w", PromptTokens: prompt, CachedTokens: held})
	}
	if mae, gMAE = mae/float64(n), gMAE/float64(n); mae > 0.05 || gMAE < 0.3 {
		t.Fatalf("MAE %.3f (G alone %.3f): want ≤ 0.05, where G's one share errs by ≥ 0.3", mae, gMAE)
	}
}
