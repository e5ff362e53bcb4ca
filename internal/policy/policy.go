// Package policy chooses the worker for a request. A Policy gets the candidate workers and a
// request view and returns one worker; it sees health only through Worker.Available and load only
// through the Loads interface, so that the same policy code runs in the gateway and in the fleet
// simulator, on local or on global load.
package policy

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// Request is what a policy may know about one request. Grow this struct, not Pick's signature.
type Request struct {
	// Model is the requested model id ("" when the body named none).
	Model string
	// Text is the routing text: the prompt prefix that cache-aware matching sees.
	// It may be truncated to the length policies need.
	Text string
	// Key is the session routing key: the x-kvgate-routing-key header, else a session header,
	// the body's prompt_cache_key or conversation, else the user (the x-user-id header, the
	// body's "user"), else "" (the gateway's sessionKeys).
	Key string
	// Affinity is the conversation's placement key ("" when the request names no conversation:
	// no key, or only a user): the cost policies order a prompt's tied candidates and credit its
	// rendezvous owner by it instead of by the prompt's opening, so that every turn of a
	// conversation, through any replica, meets the cache its first turn left.
	Affinity string
	// Salt is a digest of the request's cache salt (vLLM's cache_salt), when Salted. Text then
	// opens with a mark of the salt, so the prefix trees hold each salt's prefixes apart; the
	// engines' KV events key a salted chain by its salt too (kvevents).
	Salt   uint64
	Salted bool
	// Chat is set for chat completions, whose prompt is the body's messages.
	Chat bool
	// Body is the raw request body, read-only; nil when the caller has none. Precise routing
	// sends a chat request's messages to the engine's tokenizer from it (Prepare). It is valid
	// only during Prepare and Pick: the gateway recycles the buffer once the request is done.
	Body []byte
	// PromptBytes is the length of the whole prompt in bytes as the caller knows it (the request
	// body's length at the gateway), 0 when unknown. Text may be cut to a few KiB; this tells a
	// policy how much prefill the request carries past it.
	PromptBytes int
	// ID is the request's id as the gateway logs it, "" when unknown: the replica sync plane
	// names the decision by it.
	ID string
	// Adapter is the LoRA adapter the request names as its model ("" the base model, or no
	// worker lists the model with a parent): the cost's adapter term L prices it (costlora.go).
	Adapter string
	// Parent is the base model of Adapter ("" for a base model's request): the model the
	// engines' KV-event topics name for the adapter's blocks (loraevents.go).
	Parent string
	// Tried are the workers earlier attempts of this request went to: Choose leaves them out
	// while another available candidate remains (FilterTried). Nil on a first attempt.
	Tried []*worker.Worker
	// Startable, when set, returns the candidates flow control judges can start the request now
	// (all of them when every one can, or none can): Choose leaves the others out of a first
	// attempt (FilterCannotStart). Nil without a queue.
	Startable func(candidates []*worker.Worker) []*worker.Worker

	// Decision is written by Pick: how the policy chose. A retry's Pick overwrites it, so after
	// the last attempt it describes the worker that served the request.
	Decision Decision

	peers peerChain // Text hashed for the replica sync plane (peers.go)
	prep  prepared  // what Prepare fetched (precise.go)
}

// Decision records why a policy picked the worker it returned, for audit headers, metrics and
// the bench's prediction accuracy. The zero value means "no detail": a policy without branches
// (random, round_robin, power_of_two, least_load) leaves it so.
type Decision struct {
	// Worker is the id of the worker picked; "" when none was. Choose sets it.
	Worker string
	// Branch names the way the policy decided (BranchCacheHit, BranchSticky, ...); "" when the
	// policy has a single way.
	Branch string
	// Predicted is the share of the routing text, in [0,1], that the policy expects the chosen
	// worker to hold in its prefix cache; meaningful only when HasPrediction.
	Predicted float64
	// HasPrediction is true when the policy keeps a view of the workers' caches (a prefix tree)
	// and so predicted a share.
	HasPrediction bool
	// WholePrompt is true when Predicted is already a share of the whole prompt (the cost-based
	// policies count the whole prompt), not of the routing text: PromptShare must not scale it.
	WholePrompt bool
	// HasCost is true when a cost-based policy decided (cost.go): Chosen holds the chosen
	// worker's terms and RunnerUp the next cheapest candidate's (zero when there was none).
	HasCost bool
	// Chosen and RunnerUp are the cost terms of the chosen worker and of the runner-up.
	Chosen, RunnerUp Terms
	// Basis is what the chosen worker's Ĉ was made of, and At when the decision was made, for
	// learning from the answer (learn.go); zero for a policy that keeps no tree.
	Basis Basis
	At    time.Time
	// Filtered counts the candidates each filter reason (Filter*, by index) left out of the
	// decision.
	Filtered [NumFilters]int32
}

// decide records d on req; req may be nil in tests that call Pick without a view.
func (req *Request) decide(branch string, predicted float64, has bool) {
	if req != nil {
		req.Decision = Decision{Worker: req.Decision.Worker, Branch: branch, Predicted: predicted, HasPrediction: has}
	}
}

// Policy picks one worker among candidates for req, or nil when none is available. Candidates
// may include unavailable workers; a policy must skip those for which Available is false.
// Implementations are safe for concurrent use.
type Policy interface {
	// Name returns the canonical policy name.
	Name() string
	// Pick chooses the worker; it does no I/O (what a decision needs from elsewhere, Prepare
	// fetched before). ctx is the request's.
	Pick(ctx context.Context, candidates []*worker.Worker, req *Request) *worker.Worker
}

// Forgetter is implemented by policies that keep per-worker state (a prefix tree, a hash ring):
// Forget drops everything they hold for the worker, at once.
type Forgetter interface {
	Forget(workerID string)
}

// CacheObserver is implemented by policies that learn from what workers report cached. Once a
// request's answer shows its usage, the gateway calls Observed with the share of the whole
// prompt that the Decision predicted cached (PromptShare of it) and the share the worker
// reported (cached_tokens ÷ prompt_tokens), both in [0,1]. Only for decisions with a prediction.
type CacheObserver interface {
	Observed(predicted, reported float64)
}

// DecisionTimer is implemented by policies that time their decisions (precise_prefix: the
// event match; the tokenization is Prepare's, before the decision).
type DecisionTimer interface {
	// DecisionTime returns the number of timed decisions and the mean time one took.
	DecisionTime() (n int64, mean time.Duration)
}

// Unwrapper is implemented by policies that wrap another (Sticky).
type Unwrapper interface {
	// Inner returns the wrapped policy.
	Inner() Policy
}

// As finds an optional interface T on p or, through Unwrapper, on a policy it wraps.
func As[T any](p Policy) (T, bool) {
	for p != nil {
		if t, ok := p.(T); ok {
			return t, true
		}
		u, ok := p.(Unwrapper)
		if !ok {
			break
		}
		p = u.Inner()
	}
	var zero T
	return zero, false
}

// Loads is how a policy reads load. Load is the worker's effective load in requests (running plus
// waiting); Report is its last fresh self-reported load, ok false when there is none (never
// polled, poll failed, or stale).
type Loads interface {
	Load(w *worker.Worker) int64
	Report(w *worker.Worker) (r loadmon.Report, ok bool)
}

// LocalLoads reads only this gateway's in-flight counters. Zero value ready to use.
type LocalLoads struct{}

// Load returns w's in-flight count.
func (LocalLoads) Load(w *worker.Worker) int64 { return w.Inflight() }

// Report always reports no data.
func (LocalLoads) Report(*worker.Worker) (loadmon.Report, bool) { return loadmon.Report{}, false }

var _ Loads = LocalLoads{}

// Choose asks p for a worker and completes req.Decision: it clears what an earlier pick left
// there (a retry), and names the worker picked. Callers use it rather than Pick so that the
// decision record always describes the last pick.
func Choose(ctx context.Context, p Policy, candidates []*worker.Worker, req *Request) *worker.Worker {
	req.Decision = Decision{}
	w := p.Pick(ctx, filterRequest(candidates, req), req)
	if w != nil {
		req.Decision.Worker = w.ID
	}
	return w
}

// PromptShare turns a prediction about the routing text (the first routed bytes of a prompt of
// total bytes) into one about the whole prompt. A match that ends inside the routed text says
// the rest is not cached: the share scales down by routed/total. A match of all of it says
// nothing about the rest; the policy routed on the assumption that it follows, so the
// prediction stays as it is.
//
// Callers skip it for a Decision whose WholePrompt is set.
func PromptShare(predicted float64, routed, total int) float64 {
	if total <= routed || routed <= 0 || predicted >= 1 {
		return predicted
	}
	return predicted * float64(routed) / float64(total)
}
