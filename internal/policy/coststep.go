package policy

import "time"

// The shared-step term of the cost, K_w in seconds: what this prompt's prefill adds to the first
// tokens of the requests sent to w within its current decode step, which share the next step's
// prefill chunk with it.
//
//	K_w = n_w × ( max(0, (X_w + min(u, C − X_w))/μ_w − D_w) − max(0, X_w/μ_w − D_w) ),
//	u = P − Ĉ_w,   X_w = min(Q_w + sent_w, C)
//
// A continuously batching engine prefills the prompts that arrived during a decode step in the
// next step, at most C = CostConfig.PrefillChunk tokens of them, alongside the batch's decode: the
// step lasts the longer of the two, D_w (one decode step, the D term) or its prefill ÷ μ_w, and
// every prompt that completes in it gets its first token at its end. X_w (tokens) is what that
// step carries before this prompt: the queued prefill Q_w, then sent_w, the uncached tokens this
// replica sent w over the last D_w seconds and after w's last report, at most a chunk. Only this
// replica's own sends count, unscaled: S's "every replica sends about as much" counted as many
// sends in every step behind 8 gateways, and moved conversations off their holders (multi-turn,
// 8 gateways, seed 1: TTFT p99 101 → 112 ms; unscaled 101 ms, as off). While the step's
// prefill fits under its decode, a prompt joining it delays no one; past that, each of the n_w
// requests sent within the step waits as long for its first token as the joining prompt's part
// of the chunk lengthens the step; a full chunk takes no more, and the prompt waits for a later
// step. n_w (requests) is those sends' count, times CostConfig.DelayShare (K is the same kind of delay as B's: other requests' first tokens).
//
// K is what lets a herd price itself: requests decided within one step tie on every term a report
// can carry (their D differs by one request each, inside ε), until the engine they follow has
// been sent more prefill than its decode step hides; then each further request there costs the
// ones before it their wait. CostConfig.StepDelay turns it on; off, the cost is §8's.

// stepSends sets the shared step's sends of c (t.StepSent, t.StepTokens, t.StepRoom) as of now
// (Q, D, c.r set); the caller holds s.mu. K itself is priced with Ĉ (Terms.stepDelay).
func (s *scorer) stepSends(c *costCand, now time.Time) {
	t := &c.t
	t.StepSent, t.StepTokens, t.StepRoom = 0, 0, 0
	if !s.cfg.StepDelay || t.Decode <= 0 || !c.fresh {
		return
	}
	from := now.Add(-time.Duration(t.Decode * float64(time.Second)))
	if c.r.polled.After(from) {
		from = c.r.polled // what the report counts is prefilled or queued (Q) already
	}
	n, x := c.st.herd.within(from)
	chunk := s.cfg.PrefillChunk
	t.StepSent, t.StepTokens = float64(n)*s.cfg.DelayShare, min(t.Queued+x, chunk)
	t.StepRoom = chunk - t.StepTokens
}

// stepDelay is K of t (StepSent, StepTokens, StepRoom, Rate, Decode and Cached set), in seconds;
// +Inf where a term is NaN (a hostile report).
func (t *Terms) stepDelay() float64 {
	if t.StepSent <= 0 || !(t.Rate > 0) {
		return 0
	}
	u := min(max(t.Prompt-t.Cached, 0), t.StepRoom)
	longer := func(x float64) float64 { return max(x/t.Rate-t.Decode, 0) }
	return finite(t.StepSent * (longer(t.StepTokens+u) - longer(t.StepTokens)))
}
