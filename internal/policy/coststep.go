package policy

import "time"

// The shared-step term of the cost, K_w in seconds: what this prompt's prefill adds to the first
// tokens of the requests sent to w within its current decode step, which share the next step's
// prefill chunk with it.
//
//	K_w = n_w × ( max(0, (X_w + u)/μ_w − D_w) − max(0, X_w/μ_w − D_w) ),   u = P − Ĉ_w
//
// A continuously batching engine prefills the prompts that arrived during a decode step in the
// next step, alongside the batch's decode: the step lasts the longer of the two, D_w (one decode
// step, the D term) or its prefill, (X_w + u) ÷ μ_w, and every prompt in it gets its first token
// at its end. While the step's prefill fits under its decode, a prompt joining it delays no one;
// past that, each of the n_w prompts already in it waits as long for its first token as the
// joining prompt's prefill lengthens the step. n_w (requests) and X_w (uncached tokens) are what
// this replica sent w over the last D_w seconds and after w's last report, times the report's
// replica estimate (every replica sends about as much, as S counts), times
// CostConfig.DelayShare (K is the same kind of delay as B's: other requests' first tokens).
//
// K is what lets a herd price itself: requests decided within one step tie on every term a report
// can carry (their D differs by one request each, inside ε), until the engine they follow has
// been sent more prefill than its decode step hides; then each further request there costs the
// ones before it their wait. CostConfig.StepDelay turns it on; off, the cost is §8's.

// stepSends sets the shared step's sends of c (t.StepSent, t.StepTokens) as of now (D, c.r set);
// the caller holds s.mu. K itself is priced with Ĉ (Terms.stepDelay).
func (s *scorer) stepSends(c *costCand, now time.Time) {
	t := &c.t
	t.StepSent, t.StepTokens = 0, 0
	if !s.cfg.StepDelay || t.Decode <= 0 || !c.fresh {
		return
	}
	from := now.Add(-time.Duration(t.Decode * float64(time.Second)))
	if c.r.polled.After(from) {
		from = c.r.polled // what the report counts is prefilled or queued (Q) already
	}
	n, x := c.st.herd.sinceTokens(from)
	scale := max(c.r.replicas, 1) * s.cfg.DelayShare
	t.StepSent, t.StepTokens = float64(n)*scale, x*max(c.r.replicas, 1)
}

// stepDelay is K of t (StepSent, StepTokens, Rate, Decode and Cached set), in seconds.
func (t *Terms) stepDelay() float64 {
	if t.StepSent <= 0 || !(t.Rate > 0) {
		return 0
	}
	u := max(t.Prompt-t.Cached, 0)
	longer := func(x float64) float64 { return max(x/t.Rate-t.Decode, 0) }
	return finite(t.StepSent * (longer(t.StepTokens+u) - longer(t.StepTokens)))
}
