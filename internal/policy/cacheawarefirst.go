package policy

import "sync"

// Passing over an owner that is prefilling (docs/routing.md §8.5). Behind several gateways a new
// prompt keeps its rendezvous owner, so that every replica agrees where a new conversation lives
// (cacheawarerotate.go), and the new prompts reach each engine as a random stream whose
// prefills now and then land in the same few steps, stretching the step that every decoding
// request waits for. A replica knows, at step resolution, which of its own requests to each
// worker have not yet had the first byte of their answer (worker.Worker.Awaiting: waiting for,
// or in, their prefill). While the fleet is decode-bound, a new prompt passes over a worker
// with such a request from this replica and goes to the first worker in its rendezvous order
// that has none (when every one has, the rendezvous order decides as before).
//
// That moves a prompt away from its owner, which splits a conversation whose later turns reach
// other replicas: their trees do not hold it and they place it by its hash, at the owner
// (measured on decode-bound multi-turn at 8 gateways: hit 0.643 → 0.550, TTFT p99 2.6 → 5.8 s).
// A replica can tell that other replicas place the conversations it sees: the engines then
// report cached far more of the prompts than its tree predicted (on that run the mean of
// reported − predicted share is 0.32; on one-shot shared-prefix traffic it is 0.06). So the
// pass-over holds only while a moving average of that difference (unpredictedWindow answers) is
// at most unpredictedGate.

// prefilling reports whether this replica has a request in flight to c's worker that has not yet
// had the first byte of its answer.
func prefilling(c *cand) bool { return c.w.Awaiting() > 0 }

// unpredicted is a moving average of the share of the prompt that the engines reported cached
// beyond what this replica predicted.
type unpredicted struct {
	mu  sync.Mutex
	avg float64
}

// Observed records one answered request (policy.CacheObserver): predicted is the share of the
// prompt this replica predicted cached, reported the share the engine reported. Values outside
// [0,1] (a worker's bogus usage) are clamped.
func (p *CacheAwareHash) Observed(predicted, reported float64) {
	d := clamp01(reported) - clamp01(predicted)
	u := &p.unpred
	u.mu.Lock()
	defer u.mu.Unlock()
	u.avg += (d - u.avg) / unpredictedWindow
}

func clamp01(x float64) float64 {
	if !(x > 0) { // NaN too
		return 0
	}
	return min(x, 1)
}

// othersPlace reports whether the engines' caches hold much more of this replica's prompts than
// its tree predicted: other replicas place the conversations this one sees.
func (p *CacheAwareHash) othersPlace() bool { return p.Unpredicted() > unpredictedGate }

// unpredictedWindow is the number of answers over which the unpredicted share is averaged
// (an exponential moving average of that time constant): at 300 req/s over 8 replicas about
// 7 s of one replica's traffic.
const unpredictedWindow = 256

// unpredictedGate is the mean unpredicted cached share above which new prompts keep their owner
// whatever it is prefilling. Measured means (reported − predicted): 0.06–0.08 on shared-prefix at
// 1 and 8 gateways, −0.01 on multi-turn at one gateway, 0.32 on multi-turn at 8 gateways.
const unpredictedGate = 0.15

// Unpredicted returns the moving average of the share of the prompt that workers reported
// cached beyond what this replica predicted (Observed).
func (p *CacheAwareHash) Unpredicted() float64 {
	u := &p.unpred
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.avg
}
