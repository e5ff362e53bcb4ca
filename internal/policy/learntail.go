package policy

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"sync"

	"github.com/kvgate/kvgate/internal/radix"
	"github.com/kvgate/kvgate/internal/worker"
)

// The prediction of the tail: how much of the prompt past the routing text (which the tree
// never sees) a worker that holds all of the routing text has cached. Three predictors are
// kept for each kind of full match, and the prediction uses the one whose recent answers erred
// least (a moving sum over learnWindow answers of |predicted − reported| ÷ prompt):
//
//   - share: F's weighted median, a share of the tail (follower.median): conversations whose
//     every turn is resent whole on one worker are cached whole or not at all;
//   - tokens: the weighted median of the tail's cached tokens themselves: a shared opening
//     that runs past the routing text is cached as far as it runs, whatever follows it;
//   - sent: what this replica last sent the worker under the same routing text (a
//     conversation's previous turn: the tail cached is its length past the routing text),
//     nothing once it is older than the worker's tails were seen to survive: learned as the
//     tree's capacity is (learncap.go), from whether the answers showed at least half of a
//     tail sent before still cached. A tail dies sooner than the routing text before it,
//     which other prompts that open the same way keep touching.
//
// None of this reaches the cost: Ĉ keeps F's prior (CostConfig.FollowRouteLearned aside).

// Tail predictors.
const (
	tailShare  = 0
	tailTokens = 1
	tailSent   = 2
	tailKinds  = 3
)

// tailTokenBins resolves the cached tail's tokens to 1/8 of an octave up to 2^24; bin 0 is
// none.
const (
	tailBinsPerOctave = 8
	tailTokenBins     = 1 + 24*tailBinsPerOctave
)

// tailBin returns the bin of tokens.
func tailBin(tokens float64) int {
	if tokens < 1 {
		return 0
	}
	return min(1+int(math.Log2(tokens)*tailBinsPerOctave), tailTokenBins-1)
}

// tailBinTokens returns the tokens bin i stands for (its geometric middle).
func tailBinTokens(i int) float64 {
	if i == 0 {
		return 0
	}
	return math.Exp2((float64(i-1) + 0.5) / tailBinsPerOctave)
}

// maxSentTails bounds the (worker, routing text) pairs remembered with what was last sent
// under them: about 2.5 MB.
const maxSentTails = 1 << 14

// tails keeps the tokens predictor's histograms, the predictors' errors and what was last
// sent under each routing text.
type tails struct {
	mu sync.Mutex
	// tokens[class][bin] weighs the answers (each by 1 ÷ its prompt) whose cached tail fell in
	// bin; err[class][kind] sums each predictor's error; n counts answers up to learnWindow.
	tokens [4][tailTokenBins]float64
	err    [4][tailKinds]float64
	n      [4]int
	// sent maps a worker and a routing text's hash to the prompt last sent there under it.
	sent map[sentKey]sentTail
}

type sentKey struct {
	worker string
	text   uint64
}

// sentSeed seeds the routing texts' hashes in sentKey (textKey).
var sentSeed = maphash.MakeSeed()

// textKeyTail is how much of a routing text's end textKey reads, in bytes.
const textKeyTail = 1024

// textKey identifies a routing text in sentKey: its length and its last textKeyTail bytes,
// hashed by the runtime's maphash. Two texts of one length whose ends agree are taken as one,
// and a prompt's routing text is its opening, so they agree on everything before too unless two
// prompts differ only in the middle of it; the price of a false match is one tail predicted
// wrong, and nothing routes on it. It is this process's map key, never shared with another
// replica. Hashing the whole 8 KiB text with hashString was a fifth of a decision's time.
func textKey(text string) uint64 {
	var h maphash.Hash
	h.SetSeed(sentSeed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(text)))
	_, _ = h.Write(n[:])
	_, _ = h.WriteString(text[max(len(text)-textKeyTail, 0):])
	return h.Sum64()
}

// sentTail is the last sentPrompts prompts sent under one routing text to one worker, newest
// first: their tokens (the decision's estimate) and the worker's clock then.
type sentTail struct {
	tokens [sentPrompts]float64
	clock  [sentPrompts]int64
}

// sentPrompts is how many prompts sent under one routing text to one worker are kept: several
// conversations may open the same way, and the one a prompt continues is the longest of them
// that it does not exceed.
const sentPrompts = 4

// before returns the longest prompt of s no longer than tokens, ok false when there is none.
func (s *sentTail) before(tokens float64) (float64, int64, bool) {
	best := -1
	for i, t := range s.tokens {
		if t > 0 && t <= tokens && (best < 0 || t > s.tokens[best]) {
			best = i
		}
	}
	if best < 0 {
		return 0, 0, false
	}
	return s.tokens[best], s.clock[best], true
}

// add records a prompt of tokens sent at clock.
func (s *sentTail) add(tokens float64, clock int64) {
	copy(s.tokens[1:], s.tokens[:])
	copy(s.clock[1:], s.clock[:])
	s.tokens[0], s.clock[0] = tokens, clock
}

// medianTokens returns the weighted median of the cached tail's tokens for class, ok false
// before followPriorAnswers answers. t.mu is held.
func (t *tails) medianTokens(class int8) (float64, bool) {
	if t.n[class] < followPriorAnswers {
		return 0, false
	}
	i, ok := medianBin(t.tokens[class][:])
	return tailBinTokens(i), ok
}

// best returns the predictor of least error for class (tailShare until answers came).
func (t *tails) best(class int8) int {
	if t.n[class] < followPriorAnswers {
		return tailShare
	}
	k := tailShare
	for i := range tailKinds {
		if t.err[class][i] < t.err[class][k] {
			k = i
		}
	}
	return k
}

// routed completes a decision the tree made for chosen (nil: none), once the tree recorded
// it: the Basis gets the chosen worker's prior record (learncap.go) and the prediction its
// tail (predictTail) and its owner's part (learnowner.go).
func (p *Cost) routed(req *Request, chosen *worker.Worker, prior radix.Prior, commit bool) {
	b := &req.Decision.Basis
	b.PriorChars, b.PriorAge = prior.Chars, float64(prior.Age)
	if chosen != nil {
		p.predictTail(req, chosen.ID, commit)
		p.predictOwner(&req.Decision) // learnowner.go
	}
}

// predictTail refines the decision's prediction of the tail for the worker it chose: Basis
// gets each predictor's tail (evaluated when the answer comes) and the prediction the least
// erring one's. It records what was sent, when commit. It is prediction only: no pick reads it.
func (p *Cost) predictTail(req *Request, worker string, commit bool) {
	d := &req.Decision
	if !d.HasPrediction || req.Text == "" {
		return
	}
	b := &d.Basis
	key := sentKey{worker, textKey(req.Text)}
	clock := p.tree.Clock(worker)
	t := &p.tails
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.Class != followNone && b.Rest > 0 && d.Chosen.Prompt > 0 {
		b.Tails[tailShare] = b.Follow
		b.Tails[tailTokens] = b.Follow
		if m, ok := t.medianTokens(b.Class); ok {
			b.Tails[tailTokens] = min(m, b.Rest)
		}
		b.Tails[tailSent], b.SentTail = 0, 0
		if s, ok := t.sent[key]; ok {
			if tokens, at, ok := s.before(d.Chosen.Prompt); ok {
				b.SentTail = min(max(tokens-b.Routed, 0), b.Rest)
				b.Tails[tailSent] = b.SentTail
				if limit := p.tailCap.limit(worker); limit > 0 && float64(clock-at) > limit {
					b.Tails[tailSent] = 0 // the engine let it go
				}
			}
		}
		b.Tailed = true
		if tail := b.Tails[t.best(b.Class)]; tail != b.Follow {
			d.Predicted = clamp01(d.Predicted + (tail-b.Follow)/d.Chosen.Prompt)
			b.Follow = tail
		}
	}
	if !commit {
		return
	}
	if t.sent == nil {
		t.sent = map[sentKey]sentTail{}
	}
	if _, ok := t.sent[key]; !ok && len(t.sent) >= maxSentTails {
		for k := range t.sent { // bounded: one arbitrary entry makes room
			delete(t.sent, k)
			break
		}
	}
	s := t.sent[key]
	s.add(d.Chosen.Prompt, clock)
	t.sent[key] = s
}

// learnTail compares each tail predictor of the decision with worker's answer: cached is the
// tail's cached part the answer shows and prompt the prompt, both in the decision's tokens.
// Where the tail was sent to worker before, whether the engine kept at least half of it
// teaches how long a tail survives there (tailCap).
func (p *Cost) learnTail(b *Basis, worker string, cached, prompt float64) {
	if !b.Tailed || b.Class <= followNone || b.Class > followShared || !(b.Rest > 0) || !(prompt > 0) {
		return
	}
	cached = min(max(cached, 0), b.Rest)
	if b.SentTail > 0 && b.PriorAge > 0 {
		p.tailCap.observe(worker, b.PriorAge, cached >= b.SentTail/2)
	}
	t := &p.tails
	t.mu.Lock()
	defer t.mu.Unlock()
	c := b.Class
	h := &t.tokens[c]
	if t.n[c] >= learnWindow {
		k := 1 - 1.0/learnWindow
		for i := range h {
			h[i] *= k
		}
		for i := range t.err[c] {
			t.err[c][i] *= k
		}
	} else {
		t.n[c]++
	}
	h[tailBin(cached)] += 1 / prompt
	for i, tail := range b.Tails {
		t.err[c][i] += math.Abs(tail-cached) / prompt
	}
}
