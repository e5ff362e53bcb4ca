package policy

import (
	"math"
	"slices"
	"time"
)

// Engine speed on a mixed fleet (docs/routing.md §9, "Heterogeneous fleets"). No engine reports
// its prefill rate, but a replica that is the fleet's only gateway can measure it: between two
// polls an engine prefills what it reported at the first (SGLang's num_waiting_uncached_tokens)
// plus what this replica sent it since, less what it reports at the second. When the second
// report still exceeds what was sent since the first, the engine was working on the first
// backlog the whole interval (prefill is first come, first served), so the drained tokens over
// the interval are its prefill rate. Shorter backlogs give a lower bound, which counts only when
// it exceeds the estimate.
//
// With several gateways a replica sees only its own sends, but the fall of a backlog between two
// polls is a lower bound on the drain whatever anyone sent, and equals it over an interval in
// which nothing arrived. So each worker also keeps the decaying peak of that fall per second,
// over intervals that start with at least a second of prefill queued (prefillGateTokens) and end
// with some left: the engine prefilled throughout. Small backlogs (decode-bound traffic) are not
// sampled, since their falls say more about arrivals and cache hits than about speed.
//
// cache_aware_hash turns the rates into weights relative to the fleet's median rate, rounded to
// a power of two (speedWeight), and uses them in two places: a new prompt's rendezvous order is
// weighted (an engine half as fast as the median owns half as many keys), and, behind one
// gateway, the prefill-backlog rule of cacheawarewait.go judges each backlog divided by its
// weight, in tokens of a median engine: expected wait, not tokens. The rounding keeps the
// engines of a uniform fleet, whose measured rates differ by noise, at equal weights and so,
// nearly always, at the unweighted decisions. Measured on the Mooncake twin with two of eight
// engines half as fast (docs/routing.md §9.1), seeds 1 / 2: one gateway, load spread 1.95 /
// 2.51 → 1.63 / 1.39 and TTFT p99 4.11 / 4.20 s → 4.10 / 4.02 s; 8 gateways, spread 3.00 /
// 2.78 → 1.44 / 1.44 and p99 11.5 / 9.37 s → 7.13 / 8.42 s.

// rateAlpha is the weight of a new sample in a worker's exponential moving average of its
// prefill rate: about the last ten busy poll intervals.
const rateAlpha = 0.1

// rateSamples is how many samples a worker's rate needs before it weighs: a single interval's
// estimate carries the error of the since-poll token estimate.
const rateSamples = 4

// peakDecay is how much a worker's peak drain decays per measured interval, so that an engine
// that slows down (a degraded GPU, a changed deployment behind the same address) is seen as
// slower after some tens of intervals.
const peakDecay = 0.01

// peakSamples is how many intervals a worker's peak drain needs before it weighs. Measured at 8
// gateways: after 4 a uniform engine's peak now and then still sat below 0.71 of the median, and
// the replicas' differing weights cost agreement (Mooncake twin, bursty, TTFT p99 7,184 →
// 7,593 ms); after 8 uniform fleets keep their decisions.
const peakSamples = 2 * rateSamples

// observe records the report of worker id polled at polled with reported backlog tokens, first
// turning the previous interval (if this report is newer) into a rate sample.
func (s *sentTokens) observe(id string, polled time.Time, reported float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]sentEntry)
	}
	e := s.m[id]
	s.m[id] = e.roll(polled, reported)
}

// roll returns e moved on to the poll at polled, with the rate sample of the interval since
// e's poll folded in. A report no newer than e's leaves it as is.
func (e sentEntry) roll(polled time.Time, reported float64) sentEntry {
	if !polled.After(e.polled) {
		return e
	}
	if dt := polled.Sub(e.polled).Seconds(); !e.polled.IsZero() && dt > 0 && e.backlog > 0 {
		drained := (e.backlog + e.tokens - reported) / dt
		busy := reported > e.tokens // the first backlog lasted the whole interval
		switch {
		case busy && drained > 0:
			e.samples++
			if e.rate == 0 {
				e.rate = drained
			} else {
				e.rate += rateAlpha * (drained - e.rate)
			}
		case !busy && drained > e.rate && e.rate > 0:
			e.rate += rateAlpha * (drained - e.rate)
		}
	}
	if dt := polled.Sub(e.polled).Seconds(); !e.polled.IsZero() && dt > 0 &&
		e.backlog >= prefillGateTokens && reported > 0 && reported < e.backlog {
		// Whatever any replica sent, the engine drained at least the fall of its backlog.
		e.peak = max((e.backlog-reported)/dt, e.peak*(1-peakDecay))
		e.peaks++
	}
	e.polled, e.backlog, e.tokens = polled, reported, 0
	return e
}

// speedOf returns the prefill rate of id in tokens per second: with peak false the rate measured
// from this replica's sends (0 until rateSamples busy intervals), with peak true the decaying
// peak drain (0 until peakSamples intervals).
func (s *sentTokens) speedOf(id string, peak bool) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e := s.m[id]; {
	case !peak && e.samples >= rateSamples:
		return e.rate
	case peak && e.peaks >= peakSamples:
		return e.peak
	}
	return 0
}

// speedWeight returns a rate's weight against the fleet's median rate: the ratio rounded to the
// nearest power of two (in log scale); 1 for an unmeasured worker (rate 0). Measured on 8
// identical engines (Mooncake twin), single engines' rates lie within about 0.85–1.2 of the
// median, so the rounding (at 0.71 and 1.41) keeps them at 1; an engine half as fast measures
// 0.4–0.67 of it.
func speedWeight(rate, median float64) float64 {
	if rate <= 0 || median <= 0 {
		return 1
	}
	return math.Exp2(math.Round(math.Log2(rate / median)))
}

// weights fills w with each candidate's speed weight and reports whether any differs from 1. A
// replica that judges itself alone weighs by the rates it measured (speedOf). With several
// replicas another replica's sends would read as a slower drain, so each weighs by the peak drain
// (speedOf with peak) instead, which reads from the reports alone and so approaches the same true rate at
// every replica: their weights, rounded, agree.
func (p *CacheAwareHash) weights(av []cand, w []float64) bool {
	for i := range w {
		w[i] = 1
	}
	solo := p.solo(av)
	var buf [64]float64
	rates := buf[:0]
	for i := range av {
		if !solo {
			if r, ok := p.loads.Report(av[i].w); ok && r.HasUncachedTokens {
				p.sent.observe(av[i].w.ID, r.PolledAt, float64(r.WaitingUncachedTokens))
			}
		}
		w[i] = p.sent.speedOf(av[i].w.ID, !solo)
		if w[i] > 0 {
			rates = append(rates, w[i])
		}
	}
	slices.Sort(rates)
	var median float64
	if n := len(rates); n > 0 {
		median = (rates[(n-1)/2] + rates[n/2]) / 2
	}
	mixed := false
	for i := range w {
		w[i] = speedWeight(w[i], median)
		mixed = mixed || w[i] != 1
	}
	return mixed
}

// weightedScore is the weighted rendezvous score of a worker with hash score s and weight w:
// w / −ln(u), u being s as a fraction in (0, 1). Each worker owns a share of the keys
// proportional to its weight.
func weightedScore(s uint64, w float64) float64 {
	u := (float64(s>>11) + 0.5) / (1 << 53)
	return w / -math.Log(u)
}
