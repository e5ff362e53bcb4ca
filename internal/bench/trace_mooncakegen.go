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

	// The fields below are off at zero (the twin of the conversation trace leaves them so).

	// Groups, when positive, opens every conversation with one of Groups openings of about
	// GroupTokens tokens each (uniform ±50 %; an application's tool set or system prompt), the
	// k-th most popular chosen with weight 1/(k+1): shared by many conversations, never by all.
	Groups      int
	GroupTokens int
	// ContextSigma, when positive, draws a first prompt's unique part from a lognormal of mean
	// ContextTokens whose logarithm has this standard deviation (a heavy tail of long documents),
	// instead of uniformly within ±50 % of ContextTokens.
	ContextSigma float64
	// MinInput is the shortest first prompt, in tokens (its unique part is lengthened).
	MinInput int
	// BurstFactor, when above 1, modulates the conversation arrival rate: bursts that cover
	// BurstShare of the time (in (0, 1)) and last BurstLength on average (exponential, as are the
	// calm spells between them) arrive BurstFactor times as fast as the calm spells, at the same
	// mean Rate. Real traces are bursty at the scale of seconds to minutes, which a renewal
	// process (Burstiness) alone does not give.
	BurstFactor float64
	BurstShare  float64
	BurstLength time.Duration
}

// NewMooncakeAgentGen returns a generator for a trace shaped like an agent or tool-use
// service's: no opening shared by every request (64 tool-set openings of about 1.5k tokens,
// Zipf-popular), first prompts of at least 2k tokens with a lognormal tail (mean about 7.5k),
// conversations of 3 turns on average that resend their history plus about 3k new tokens (tool
// output) after 20 s, prompts up to 190k tokens, 3.9 req/s over 15 minutes, arriving in bursts
// three times as dense as the calm spells a fifth of the time, 30 s long on average, with gaps
// of coefficient of variation 1.5 inside each spell. Its ideal prefix reuse is about 0.65 and
// its mean prompt about 15k tokens (TestMooncakeAgentShape measures them).
func NewMooncakeAgentGen(seed uint64) *MooncakeGen {
	return &MooncakeGen{
		Seed: seed, Duration: time.Hour, Rate: 3.9, BlockTokens: 512,
		ContextTokens: 8500, ContextSigma: 1, MinInput: 2048, TurnsMean: 2.8, UserTokens: 3000,
		OutputTokens: 300, Think: 20 * time.Second, Burstiness: 4, MaxInput: 190000,
		Groups: 64, GroupTokens: 1536, BurstFactor: 5, BurstShare: 0.15, BurstLength: 10 * time.Second,
	}
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
	case g.Groups < 0 || g.Groups > 1<<20 || g.GroupTokens < 0 || g.MinInput < 0:
		return errors.New("groups, group tokens and min input must be >= 0 (groups at most 2^20)")
	case !(g.ContextSigma >= 0) || g.ContextSigma > 4:
		return fmt.Errorf("context sigma %v must be in [0, 4]", g.ContextSigma)
	case g.BurstFactor != 0 && !(g.BurstFactor >= 1 && g.BurstFactor <= 1000):
		return fmt.Errorf("burst factor %v must be 0 (off) or in [1, 1000]", g.BurstFactor)
	case g.BurstFactor > 1 && (!(g.BurstShare > 0 && g.BurstShare < 1) || g.BurstLength <= 0):
		return fmt.Errorf("bursts need a share in (0, 1) (got %v) and a positive length (got %v)", g.BurstShare, g.BurstLength)
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
	groups := g.openings(&next)
	clock := newBurstClock(g, rngFor(g.Seed, 12, 0))
	fresh := func(ids []int64, n int) []int64 {
		for range n {
			ids = append(ids, next)
			next++
		}
		return ids
	}
	var out []MooncakeEntry
	end := g.Duration.Seconds() * 1000
	for at := clock.after(0, gammaGap(r, shape, convRate)); at < end; at = clock.after(at, gammaGap(r, shape, convRate)) {
		var ids []int64
		for i := range g.SharedBlocks {
			ids = append(ids, int64(i))
		}
		input := g.SharedBlocks * bt
		if len(groups.ids) > 0 {
			k := groups.pick(r)
			ids = append(ids, groups.ids[k]...)
			input += groups.tokens[k]
		}
		input += g.contextTokens(r)
		input = max(input, g.MinInput, 1)
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

// contextTokens draws the unique part of a conversation's first prompt.
func (g *MooncakeGen) contextTokens(r *rand.Rand) int {
	if g.ContextSigma == 0 {
		return between(r, g.ContextTokens/2, g.ContextTokens*3/2)
	}
	// A lognormal of mean ContextTokens: exp(μ + σZ) with μ = ln(mean) − σ²/2.
	mu := math.Log(float64(max(g.ContextTokens, 1))) - g.ContextSigma*g.ContextSigma/2
	return int(math.Min(math.Exp(mu+g.ContextSigma*r.NormFloat64()), 1<<24))
}

// openingSet is the group openings of a trace: each one's hash ids (full blocks only, so that
// every conversation continues after them with its own blocks) and tokens, and the cumulative
// popularity weights.
type openingSet struct {
	ids    [][]int64
	tokens []int
	cum    []float64
}

// openings makes g.Groups openings from fresh hash ids.
func (g *MooncakeGen) openings(next *int64) openingSet {
	var o openingSet
	bt := max(g.BlockTokens, 1)
	if g.BlockTokens == 0 {
		bt = 512
	}
	r := rngFor(g.Seed, 13, 0)
	total := 0.0
	for k := range g.Groups {
		blocks := max(1, between(r, g.GroupTokens/2, g.GroupTokens*3/2)/bt)
		ids := make([]int64, blocks)
		for i := range ids {
			ids[i] = *next
			*next++
		}
		o.ids, o.tokens = append(o.ids, ids), append(o.tokens, blocks*bt)
		total += 1 / float64(k+1)
		o.cum = append(o.cum, total)
	}
	return o
}

// pick draws an opening by popularity.
func (o openingSet) pick(r *rand.Rand) int {
	x := r.Float64() * o.cum[len(o.cum)-1]
	k, _ := slices.BinarySearch(o.cum, x)
	return min(k, len(o.cum)-1)
}

// burstClock maps gaps drawn at the calm rate to arrival times under the rate modulation of
// MooncakeGen.BurstFactor: a gap is consumed BurstFactor times as fast inside a burst.
type burstClock struct {
	r           *rand.Rand
	factor      float64
	calm, burst float64 // mean spell lengths, seconds
	scale       float64 // calm-rate gap per mean-rate gap
	inBurst     bool
	spellEnd    float64
	on          bool
}

func newBurstClock(g *MooncakeGen, r *rand.Rand) *burstClock {
	c := &burstClock{r: r, scale: 1}
	if g.BurstFactor <= 1 {
		return c
	}
	c.on, c.factor = true, g.BurstFactor
	c.burst = g.BurstLength.Seconds()
	c.calm = c.burst * (1 - g.BurstShare) / g.BurstShare
	// The calm rate is the mean rate ÷ (1 − share + share·factor), so gaps drawn at the mean
	// rate are stretched by that much in calm time.
	c.scale = 1 - g.BurstShare + g.BurstShare*g.BurstFactor
	c.spellEnd = r.ExpFloat64() * c.calm
	return c
}

// after returns the time, in milliseconds, at which a gap of gap seconds (at the mean rate)
// drawn at time at (milliseconds) ends.
func (c *burstClock) after(at, gap float64) float64 {
	if !c.on {
		return at + gap*1000
	}
	return c.afterSeconds(at/1000, gap) * 1000
}

func (c *burstClock) afterSeconds(t, gap float64) float64 {
	g := gap * c.scale // in calm seconds
	for {
		speed := 1.0
		if c.inBurst {
			speed = c.factor
		}
		if t+g/speed <= c.spellEnd {
			return t + g/speed
		}
		g -= (c.spellEnd - t) * speed
		t = c.spellEnd
		c.inBurst = !c.inBurst
		mean := c.calm
		if c.inBurst {
			mean = c.burst
		}
		c.spellEnd = t + c.r.ExpFloat64()*mean
	}
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

// TraceShape is the measured shape of a Mooncake-format trace.
type TraceShape struct {
	// Requests is the number of lines; Span the time from the first to the last; Rate the
	// requests per second over Span.
	Requests int
	Span     time.Duration
	Rate     float64
	// MeanInput, MinInput and MaxInput describe the prompt lengths in tokens.
	MeanInput          float64
	MinInput, MaxInput int
	// IdealReuse is the share of prompt tokens one engine with an infinite cache would hit, at
	// block granularity (a request hits its longest run of leading hash ids seen before, at most
	// its input minus one token): the figure the bench reports as "ideal", to within the
	// partial last block.
	IdealReuse float64
	// GapCV is the coefficient of variation of the inter-arrival gaps (1 for Poisson).
	GapCV float64
	// SharedByAll is the number of hash ids every request's prompt contains.
	SharedByAll int
}

// MeasureMooncake measures the shape of entries (in timestamp order) for blocks of blockTokens
// tokens (zero means 512).
func MeasureMooncake(entries []MooncakeEntry, blockTokens int) TraceShape {
	var s TraceShape
	if len(entries) == 0 {
		return s
	}
	if blockTokens <= 0 {
		blockTokens = 512
	}
	s.Requests, s.MinInput = len(entries), entries[0].InputLength
	seen := map[int64]struct{}{}
	inAll := map[int64]int{}
	var prompt, cached, total float64
	var gaps []float64
	for i, e := range entries {
		m := 0
		for m < len(e.HashIDs) {
			if _, ok := seen[e.HashIDs[m]]; !ok {
				break
			}
			m++
		}
		for j, id := range e.HashIDs {
			if j >= m {
				seen[id] = struct{}{}
			}
			if inAll[id] == i { // counted once per request, and only while in every one so far
				inAll[id] = i + 1
			}
		}
		prompt += float64(e.InputLength)
		cached += float64(max(0, min(m*blockTokens, e.InputLength-1)))
		total += float64(e.InputLength)
		s.MinInput, s.MaxInput = min(s.MinInput, e.InputLength), max(s.MaxInput, e.InputLength)
		if i > 0 {
			gaps = append(gaps, e.Timestamp-entries[i-1].Timestamp)
		}
	}
	for _, n := range inAll {
		if n == len(entries) {
			s.SharedByAll++
		}
	}
	s.Span = time.Duration((entries[len(entries)-1].Timestamp - entries[0].Timestamp) * float64(time.Millisecond))
	if s.Span > 0 {
		s.Rate = float64(len(entries)-1) / s.Span.Seconds()
	}
	s.MeanInput = total / float64(len(entries))
	if prompt > 0 {
		s.IdealReuse = cached / prompt
	}
	if len(gaps) > 1 {
		m := 0.0
		for _, g := range gaps {
			m += g
		}
		m /= float64(len(gaps))
		v := 0.0
		for _, g := range gaps {
			v += (g - m) * (g - m)
		}
		if m > 0 {
			s.GapCV = math.Sqrt(v/float64(len(gaps))) / m
		}
	}
	return s
}

// String prints the shape on one line.
func (s TraceShape) String() string {
	return fmt.Sprintf("%d requests over %v (%.2f req/s, gap CV %.2f), prompts %d–%d tokens (mean %.0f), ideal reuse %.3f, %d blocks shared by all",
		s.Requests, s.Span.Round(time.Second), s.Rate, s.GapCV, s.MinInput, s.MaxInput, s.MeanInput, s.IdealReuse, s.SharedByAll)
}
