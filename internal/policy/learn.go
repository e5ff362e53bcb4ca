package policy

import (
	"sync"

	"github.com/kvgate/kvgate/internal/radix"
)

// Learning from the answers. Every answer that reports usage.prompt_tokens_details.cached_tokens
// (SGLang's meta_info.cached_tokens on /generate) says how much of its prompt the engine really
// reused: the truth, for that worker and that prompt, against which the decision's Ĉ was a
// prediction. The cost-based policies learn two things from it:
//
//   - F, the follow share, in [0,1] (a share of the tokens past the routing text): what part of
//     the prompt past the routing text (which the prefix tree never sees) a worker holding all
//     of the routing text really had cached. It is learned apart for two kinds of match, since
//     they differ the most: an opening the tree places on several workers (a shared system
//     prompt, after which prompts go their own ways) and a text placed on one worker only (a
//     conversation's history, resent whole). CostConfig.FollowShare is its prior, weighted as
//     followPriorAnswers answers, so the first answers move it only part of the way.
//   - Each worker's calibration: the moving average of predicted − reported cached share (a
//     share of the whole prompt), Calibration; a worker whose engine keeps less than the tree
//     thinks shows a positive one.
//
// The tree itself is corrected too (radix.Tree.Correct): where the answer shows the engine held
// less of the routing text than the tree placed on it, the worker's other branches below that
// point are dropped (the engine evicted the prefix they hang from; the request's own path is
// back, its prefill put it there), and where it held more, the reported prefix is recorded.

// Answer is what an engine's answer reported about one request's prompt.
type Answer struct {
	// Worker is the id of the worker that answered.
	Worker string
	// PromptTokens and CachedTokens are usage.prompt_tokens and
	// usage.prompt_tokens_details.cached_tokens (or their equivalents), in tokens.
	PromptTokens, CachedTokens int
}

// AnswerLearner is implemented by policies that learn from what each answer reports cached.
// The gateway calls Learn once per answered request whose Decision HasPrediction and whose
// answer reported cached tokens, with the request as the last Pick left it (its Text and
// Decision). Learn must be quick and safe for concurrent use; it must not keep req.
type AnswerLearner interface {
	Learn(req *Request, a Answer)
}

// Basis is what a cost decision based its prediction on, kept in the Decision so that the
// answer can be compared with each part: zero when the policy keeps no tree.
type Basis struct {
	// Routed is the part of Ĉ the tree (or the events) placed within the routing text, in
	// tokens; RoutedChars the same in characters of the routing text.
	Routed      float64
	RoutedChars int
	// Rest is the prompt past the routing text, in tokens; Follow the part of it expected
	// cached (F × Rest, or 0 where the routing text was not wholly held), RouteFollow the part
	// the cost counted in Ĉ (Follow, or the prior's unless CostConfig.FollowRouteLearned).
	Rest, Follow, RouteFollow float64
	// Credit is the rendezvous owner's credit in Ĉ (Cost.creditOwner), in tokens; the
	// prediction counts the learned share of it that the answers showed held.
	Credit float64
	// Class is the kind of match F was read for (followShared, followOwn); followNone (zero)
	// when the routing text was not wholly held, so no F was applied.
	Class int8
	// PriorChars and PriorAge are the chosen worker's deepest record on the routing text's path
	// before the decision (radix.Prior; learncap.go): its end, in characters of the routing
	// text, and its age, in tokens on the worker's clock. Zero when it had none.
	PriorChars int
	PriorAge   float64
	// Tails are each tail predictor's part of Rest predicted cached (learntail.go), in tokens,
	// Tailed whether they were filled in; Follow is the one the prediction used. SentTail is
	// the tail last sent to the worker under the same routing text, in tokens (0: none).
	Tails    [tailKinds]float64
	Tailed   bool
	SentTail float64
	// Events is what precise_prefix's events said the worker holds of the EventsOf tokens they
	// were asked about, Evented whether they answered for it (precisedrift.go).
	Events, EventsOf float64
	Evented          bool
	// Owners are each owner predictor's part of Credit predicted held (learnowner.go), in
	// tokens, Owned whether they were filled in.
	Owners [ownerKinds]float64
	Owned  bool
}

// Kinds of full match, each with its own follow share.
const (
	followNone   int8 = 0
	followOwn    int8 = 1 // the whole routing text held by this worker alone
	followShared int8 = 2 // the whole routing text held by two or more workers
	// followOwner is not a kind of match but the rendezvous owner's credit (Cost.creditOwner):
	// the share of it the answers showed held, learned the same way, for the prediction only.
	followOwner int8 = 3
)

// followPriorAnswers is the weight of CostConfig.FollowShare in the learned F, in answers of
// the mean rest.
const followPriorAnswers = 8

// learnWindow is the number of answers the learned shares are averaged over: a moving average
// with weight 1/learnWindow on each new answer once that many were seen.
const learnWindow = 256

// follower learns F for each kind of full match.
type follower struct {
	mu sync.Mutex
	// cached and rest sum, over the answers of each kind (decayed), the tokens past the routing
	// text reported cached and the tokens past it.
	cached, rest [4]float64
	n            [4]int
	// hist is, per class, the weight of the answers (decayed as the sums are) whose cached
	// part of the tokens past the routing text fell in each of followBins equal bins; each
	// answer weighs its tail's share of the prompt, so that the weighted median is the F of
	// least absolute error in the share of the prompt predicted (median).
	hist [4][followBins]float64
}

// followBins is the resolution of the learned median F: bins of 0.05.
const followBins = 21

// median returns the weighted median of the cached part of the tail for class, ok false
// before followPriorAnswers answers.
func (f *follower) median(class int8) (float64, bool) {
	if class <= followNone || class > followOwner {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[class] < followPriorAnswers {
		return 0, false
	}
	i, ok := medianBin(f.hist[class][:])
	return float64(i) / (followBins - 1), ok
}

// share returns F for class, the prior when nothing was learned. prior is in [0,1].
func (f *follower) share(class int8, prior float64) float64 {
	if class <= followNone || class > followOwner {
		return prior
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.n[class]
	if n == 0 {
		return prior
	}
	mean := f.rest[class] / float64(n) // the mean rest, in tokens
	w := followPriorAnswers * mean
	return clamp01((f.cached[class] + prior*w) / (f.rest[class] + w))
}

// add records one answer of class: rest tokens past the routing text of a prompt of prompt
// tokens, of which cached were reported cached.
func (f *follower) add(class int8, cached, rest, prompt float64) {
	if class <= followNone || class > followOwner || !(rest > 0) {
		return
	}
	cached = min(max(cached, 0), rest)
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &f.hist[class]
	if f.n[class] >= learnWindow {
		k := 1 - 1.0/learnWindow
		f.cached[class] *= k
		f.rest[class] *= k
		for i := range h {
			h[i] *= k
		}
	} else {
		f.n[class]++
	}
	f.cached[class] += cached
	f.rest[class] += rest
	h[int(cached/rest*(followBins-1)+0.5)] += min(rest/max(prompt, rest), 1)
}

// correctSlackTokens is how far, in tokens, an answer's cached prefix may fall short of the
// tree's before the tree is corrected: a few of the engines' cache blocks (vLLM's are 16 tokens,
// SGLang's pages 1 to 64), and the error of estimating tokens from bytes.
const correctSlackTokens = 64

// calibration keeps each worker's moving average of predicted − reported cached share.
type calibration struct{ perWorker[calib] }

type calib struct {
	avg float64
	n   int
}

// add records one answer of worker: err is predicted − reported share.
func (c *calibration) add(worker string, err float64) {
	c.update(worker, func(e *calib) {
		e.n = min(e.n+1, learnWindow)
		e.avg += (err - e.avg) / float64(e.n)
	})
}

// maxCalibrated bounds the workers whose learned state (calibration, capacity, drift) is kept.
const maxCalibrated = 4096

// snapshot returns worker → its moving error.
func (c *calibration) snapshot() map[string]float64 {
	return each(&c.perWorker, func(e *calib) (float64, bool) { return e.avg, true })
}

// Calibrator is implemented by policies that keep each worker's prediction error.
type Calibrator interface {
	// Calibration returns worker id → the moving average of predicted − reported cached share
	// of its answers, in [−1, 1].
	Calibration() map[string]float64
}

// Calibration returns each worker's moving prediction error (Calibrator).
func (p *Cost) Calibration() map[string]float64 { return p.calib.snapshot() }

// followShare returns F for a full match of class: the learned one, or the configured one when
// CostConfig.FollowFixed.
func (p *Cost) followShare(class int8) float64 {
	if p.sc.cfg.FollowFixed {
		return p.sc.cfg.FollowShare
	}
	return p.follow.share(class, p.sc.cfg.FollowShare)
}

// ownerHeld returns the part of an owner's credit of credit tokens that the prediction
// counts: the weighted median of the share of their credits that owners were shown to hold
// (follower.median), else their mean share, 0 until answers show otherwise. Measured behind 8
// gateways against the mean share: the conversation trace 0.075 against 0.115, multi-turn 0.246
// against 0.242.
func (p *Cost) ownerHeld(credit float64) float64 {
	if credit <= 0 {
		return 0
	}
	if m, ok := p.follow.median(followOwner); ok {
		return credit * m
	}
	return credit * p.follow.share(followOwner, 0)
}

// expectedFollow returns the F the prediction uses for class: the weighted median of what the
// answers showed cached past the routing text (the tails of one kind are mostly cached whole
// or not at all, and the median is the prediction of least absolute error), else mean, the
// learned mean share.
func (p *Cost) expectedFollow(class int8, mean float64) float64 {
	if p.sc.cfg.FollowFixed {
		return mean
	}
	if m, ok := p.follow.median(class); ok {
		return m
	}
	return mean
}

// FollowShares returns the learned F for a match held by one worker and for one held by
// several.
func (p *Cost) FollowShares() (own, shared float64) {
	return p.followShare(followOwn), p.followShare(followShared)
}

// Learn compares the answer with the decision's prediction for that worker and corrects what
// the policy believes (AnswerLearner).
func (p *Cost) Learn(req *Request, a Answer) {
	d := &req.Decision
	if !d.HasPrediction || a.PromptTokens <= 0 || a.Worker == "" || a.Worker != d.Worker {
		return
	}
	reported := min(max(float64(a.CachedTokens), 0), float64(a.PromptTokens))
	share := reported / float64(a.PromptTokens)
	p.calib.add(a.Worker, clamp01(d.Predicted)-share)
	b := &d.Basis
	p.learnDrift(b, a.Worker, reported) // precisedrift.go
	// The answer's tokens and the decision's estimate of them differ (bytes per token, a chat
	// template): each part of the prediction is compared as a share of the prompt.
	scale := float64(a.PromptTokens) / max(d.Chosen.Prompt, 1)
	switch {
	case b.Credit > 0:
		// What the engine held past the tree's own prediction is the owner's credit's to explain.
		p.follow.add(followOwner, reported-(b.Routed+b.Follow)*scale, b.Credit*scale, float64(a.PromptTokens))
		p.learnOwner(b, reported/scale-(b.Routed+b.Follow), (float64(a.PromptTokens)-reported)/scale, float64(a.PromptTokens)/scale) // learnowner.go
	case b.Class != followNone:
		p.follow.add(b.Class, reported-b.Routed*scale, b.Rest*scale, float64(a.PromptTokens))
		p.learnTail(b, a.Worker, reported/scale-b.Routed, float64(a.PromptTokens)/scale) // learntail.go
	}
	if p.prefixTree != nil && req.Text != "" {
		// What the engine held of the routing text, in its characters.
		routedTok := max(d.Chosen.Prompt-b.Rest, 1)
		held := int(min(reported/scale/routedTok, 1) * float64(radix.CharCount(req.Text)))
		// Engines count cached tokens in whole blocks, and a prompt's tokens are estimated from
		// its bytes: only a shortfall beyond correctSlackTokens is evidence of an eviction.
		held += int(correctSlackTokens * p.sc.cfg.BytesPerToken)
		if b.Routed > 0 && held < b.RoutedChars {
			p.tree.Correct(req.Text, a.Worker, held, d.At)
		}
		p.learnCapacity(b, a.Worker, held, float64(a.PromptTokens)-reported) // learncap.go
	}
}
