package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// MooncakeGen generates Mooncake-format traces with controlled reuse, conversation structure and
// arrival burstiness, for tests and for the docs (no trace file needed). Conversations arrive as
// a renewal process whose gaps have coefficient of variation Burstiness (1 is Poisson; above 1,
// bursts). Every prompt opens with the same SharedBlocks blocks (an application's system prompt).
// A conversation's first prompt adds about ContextTokens unique tokens; each later turn resends
// the whole previous prompt and reply (the reply's blocks are new ids, as the engine never
// cached them) plus about UserTokens new tokens, Think after the previous turn. A conversation has
// a geometric number of turns of mean TurnsMean. Use NewMooncakeGen for defaults that mimic the
// public conversation trace described in docs/routing.md.
type MooncakeGen struct {
	// Seed fixes the trace.
	Seed uint64
	// Duration is the trace's length; Rate its mean request rate (all turns) per second.
	Duration time.Duration
	Rate     float64
	// BlockTokens is the tokens per hash id. Zero means 512.
	BlockTokens int
	// SharedBlocks is the number of opening blocks every request shares.
	SharedBlocks int
	// ContextTokens is the mean unique part of a conversation's first prompt (uniform ±50 %).
	ContextTokens int
	// TurnsMean is the mean number of turns of a conversation (geometric, ≥ 1).
	TurnsMean float64
	// UserTokens is the mean new input of a later turn (exponential).
	UserTokens int
	// OutputTokens is the mean reply length (exponential, at least 1).
	OutputTokens int
	// Think is the mean time between a turn and the next (exponential).
	Think time.Duration
	// Burstiness is the coefficient of variation of the gaps between conversation starts.
	Burstiness float64
	// MaxInput ends a conversation whose next prompt would exceed it. Zero means 131072.
	MaxInput int
}

// NewMooncakeGen returns a generator for the synthetic twin of the public conversation trace of
// docs/routing.md: about 3 req/s over 15 minutes, one shared 512-token opening block, prompts of
// about 12k tokens on average, replies of about 340 tokens, conversations of 1.45 turns on
// average resending their history after a minute, Poisson arrivals.
func NewMooncakeGen(seed uint64) *MooncakeGen {
	return &MooncakeGen{
		Seed: seed, Duration: 15 * time.Minute, Rate: 3, BlockTokens: 512, SharedBlocks: 1,
		ContextTokens: 11000, TurnsMean: 1.45, UserTokens: 1500, OutputTokens: 340,
		Think: 60 * time.Second, Burstiness: 1, MaxInput: 131072,
	}
}

// Validate reports the first invalid field.
func (g *MooncakeGen) Validate() error {
	switch {
	case g.Duration <= 0 || g.Duration > 30*24*time.Hour:
		return fmt.Errorf("duration %v must be in (0, 30 days]", g.Duration)
	case !(g.Rate > 0) || g.Rate > 1e5:
		return fmt.Errorf("rate %v must be in (0, 1e5]", g.Rate)
	case g.BlockTokens < 0 || g.BlockTokens > 1<<16:
		return fmt.Errorf("block tokens %d must be in [0, 65536]", g.BlockTokens)
	case g.SharedBlocks < 0 || g.ContextTokens < 0 || g.UserTokens < 0 || g.OutputTokens < 0 || g.MaxInput < 0:
		return errors.New("block and token counts must be >= 0")
	case !(g.TurnsMean >= 1) || g.TurnsMean > 1000:
		return fmt.Errorf("mean turns %v must be in [1, 1000]", g.TurnsMean)
	case g.Think < 0:
		return fmt.Errorf("think time %v must be >= 0", g.Think)
	case !(g.Burstiness > 0) || g.Burstiness > 100:
		return fmt.Errorf("burstiness %v must be in (0, 100]", g.Burstiness)
	}
	return nil
}

// Generate returns the trace, in timestamp order.
func (g *MooncakeGen) Generate() ([]MooncakeEntry, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	bt := g.BlockTokens
	if bt == 0 {
		bt = 512
	}
	maxIn := g.MaxInput
	if maxIn == 0 {
		maxIn = 131072
	}
	r := rngFor(g.Seed, 11, 0)
	convRate := g.Rate / g.TurnsMean
	shape := 1 / (g.Burstiness * g.Burstiness)
	next := int64(g.SharedBlocks) // hash ids 0..SharedBlocks-1 are the shared opening
	fresh := func(ids []int64, n int) []int64 {
		for range n {
			ids = append(ids, next)
			next++
		}
		return ids
	}
	var out []MooncakeEntry
	end := g.Duration.Seconds() * 1000
	for at := gammaGap(r, shape, convRate) * 1000; at < end; at += gammaGap(r, shape, convRate) * 1000 {
		input := g.SharedBlocks*bt + between(r, g.ContextTokens/2, g.ContextTokens*3/2)
		input = max(input, 1)
		var ids []int64
		for i := range g.SharedBlocks {
			ids = append(ids, int64(i))
		}
		ids = fresh(ids, (input+bt-1)/bt-len(ids))
		t := at
		for turn := 0; ; turn++ {
			if input > maxIn || t >= end {
				break
			}
			e := MooncakeEntry{Timestamp: math.Round(t), InputLength: input, OutputLength: expInt(r, g.OutputTokens, 1), HashIDs: ids}
			out = append(out, e)
			// Turns are geometric in number: continue with probability 1 − 1/TurnsMean.
			if r.Float64() >= 1-1/g.TurnsMean {
				break
			}
			t += r.ExpFloat64() * float64(g.Think.Milliseconds())
			// The next prompt keeps the full blocks of this one; the cut last block, the reply
			// and the new user input make new blocks.
			keep := input / bt
			input += e.OutputLength + expInt(r, g.UserTokens, 1)
			ids = fresh(slices.Clone(ids[:keep]), (input+bt-1)/bt-keep)
		}
	}
	slices.SortStableFunc(out, func(a, b MooncakeEntry) int {
		switch {
		case a.Timestamp < b.Timestamp:
			return -1
		case a.Timestamp > b.Timestamp:
			return 1
		}
		return 0
	})
	return out, nil
}

// expInt returns an exponential integer of the given mean, at least lo.
func expInt(r *rand.Rand, mean, lo int) int {
	return max(lo, int(r.ExpFloat64()*float64(mean)+0.5))
}

// gammaGap returns a gap in seconds between events of a renewal process of the given rate whose
// gaps are gamma-distributed with the given shape (1/CV²): shape 1 is a Poisson process.
func gammaGap(r *rand.Rand, shape, rate float64) float64 {
	return gammaVariate(r, shape) / shape / rate
}

// gammaVariate draws a Gamma(shape, 1) variate by Marsaglia and Tsang's method (shape < 1 by
// boosting shape+1 with U^(1/shape)).
func gammaVariate(r *rand.Rand, shape float64) float64 {
	if shape < 1 {
		return gammaVariate(r, shape+1) * math.Pow(r.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
