package policy

import (
	"math"
	"sync"
)

// The prediction of the owner's credit. Behind several gateways, most prompts a replica sees are
// cached, if anywhere, on their rendezvous owner, through another replica (Cost.creditOwner);
// what the owner really holds is all of the credit or none of it far more often than G's share
// of it. Whether it holds a prompt depends most on the prompt's length: a conversation's first
// turn is short and new, its later turns long and mostly sent before. So the prediction (not
// the cost) takes the predictor of least moving error (Σ |predicted − reported| ÷ prompt, over
// learnWindow answers) of three:
//
//   - G: the weighted median of the share of their credits that owners held (ownerHeld);
//   - held by length: the same median, over the answers whose prompt fell in the same band of
//     lengths (half an octave, as the capacity's ages);
//   - uncached by length: the prompt less the median of the tokens the answers in its band
//     reported uncached (a conversation's later turn: all but its newest message cached).
//
// A band answers once followPriorAnswers answers fell in it; until then its predictors are G.

// Owner predictors.
const (
	ownerG        = 0
	ownerHeldBand = 1
	ownerUncached = 2
	ownerKinds    = 3
)

// owners keeps the owner's predictors' histograms, per band of prompt lengths, and errors.
type owners struct {
	mu sync.Mutex
	// held[band] weighs the answers by the share of the credit held (followBins bins),
	// uncached[band] by the tokens reported uncached (tailBin); n counts each band's answers up
	// to learnWindow.
	held     [capBandCount][followBins]float64
	uncached [capBandCount][tailTokenBins]float64
	n        [capBandCount]int
	err      [ownerKinds]float64
	m        int
}

// predictOwner refines a credited decision's prediction of what its owner holds: Basis gets each
// predictor's part of the credit (evaluated when the answer comes), the prediction the least
// erring one's.
func (p *Cost) predictOwner(d *Decision) {
	b := &d.Basis
	prompt := d.Chosen.Prompt
	if !d.HasPrediction || !(b.Credit > 0) || !(prompt > 0) {
		return
	}
	g := p.ownerHeld(b.Credit)
	rest := d.Predicted*prompt - g // the prediction without the owner's part
	b.Owners = [ownerKinds]float64{g, g, g}
	o := &p.owners
	o.mu.Lock()
	band := capBand(prompt)
	if o.n[band] >= followPriorAnswers {
		if i, ok := medianBin(o.held[band][:]); ok {
			b.Owners[ownerHeldBand] = b.Credit * float64(i) / (followBins - 1)
		}
		if i, ok := medianBin(o.uncached[band][:]); ok {
			b.Owners[ownerUncached] = min(max(prompt-tailBinTokens(i)-rest, 0), b.Credit)
		}
	}
	best := ownerG
	if o.m >= followPriorAnswers {
		for k := range ownerKinds {
			if o.err[k] < o.err[best] {
				best = k
			}
		}
	}
	o.mu.Unlock()
	b.Owned = true
	d.Predicted = clamp01((rest + b.Owners[best]) / prompt)
}

// learnOwner compares each owner predictor of a credited decision with the answer: held is the
// part of the credit the answer shows held, uncached the tokens it reported uncached, prompt
// the prompt, all in the decision's tokens.
func (p *Cost) learnOwner(b *Basis, held, uncached, prompt float64) {
	if !b.Owned || !(b.Credit > 0) || !(prompt > 0) {
		return
	}
	held = min(max(held, 0), b.Credit)
	o := &p.owners
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m >= learnWindow {
		for k := range o.err {
			o.err[k] *= 1 - 1.0/learnWindow
		}
	} else {
		o.m++
	}
	for k, v := range b.Owners {
		o.err[k] += math.Abs(v-held) / prompt
	}
	band := capBand(prompt)
	h, u := &o.held[band], &o.uncached[band]
	if o.n[band] >= learnWindow {
		k := 1 - 1.0/learnWindow
		for i := range h {
			h[i] *= k
		}
		for i := range u {
			u[i] *= k
		}
	} else {
		o.n[band]++
	}
	h[int(held/b.Credit*(followBins-1)+0.5)]++
	u[tailBin(max(uncached, 0))]++
}
