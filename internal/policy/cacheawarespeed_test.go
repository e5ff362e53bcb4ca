package policy

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestSentEntryRollMeasuresRate: a busy interval (the second report still exceeds what was sent
// since the first) gives the drained tokens per second; an interval in which the engine may have
// run dry only raises the estimate; older or repeated reports change nothing.
func TestSentEntryRollMeasuresRate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var s sentTokens
	s.observe("w", t0, 20000)
	s.add("w", t0, 20000, 4000) // 24,000 tokens ahead after this send
	// One second later 16,000 remain: 8,000 drained, and 16,000 > 4,000 sent, so it was busy.
	s.observe("w", t0.Add(time.Second), 16000)
	if e := s.m["w"]; e.rate != 8000 || e.samples != 1 || e.tokens != 0 || e.backlog != 16000 {
		t.Fatalf("after a busy interval: %+v, want rate 8000 from 1 sample, count restarted at backlog 16000", e)
	}
	if r := s.speedOf("w", false); r != 0 {
		t.Fatalf("speedOf after 1 sample = %v, want 0 (below rateSamples)", r)
	}
	s.observe("w", t0.Add(time.Second), 1) // the same poll again: no change
	s.observe("w", t0, 1)                  // an older poll: no change
	if e := s.m["w"]; e.samples != 1 || e.backlog != 16000 {
		t.Fatalf("a repeated or older report changed the entry: %+v", e)
	}
	// Run dry: 16,000 drained in one second with nothing left reads as a lower bound of 16,000,
	// which raises the estimate without counting as a sample.
	s.observe("w", t0.Add(2*time.Second), 0)
	if e := s.m["w"]; e.samples != 1 || e.rate <= 8000 {
		t.Fatalf("a dry interval with a higher lower bound: %+v, want a raised rate from still 1 sample", e)
	}
	rate := s.m["w"].rate
	// An idle interval (backlog 0 at the start) is no sample at all.
	s.observe("w", t0.Add(3*time.Second), 500)
	if e := s.m["w"]; e.samples != 1 || e.rate != rate {
		t.Fatalf("an interval starting idle changed the rate: %+v", e)
	}
	// A dry interval whose lower bound is below the estimate does not lower it.
	s.observe("w", t0.Add(4*time.Second), 0)
	if e := s.m["w"]; e.rate != rate {
		t.Fatalf("a low lower bound lowered the rate: %v → %v", rate, e.rate)
	}
	// The peak drain, for several replicas: the fall of the backlog per second over intervals
	// that start with at least prefillGateTokens queued and end with some left, whatever was
	// sent; it needs peakSamples such intervals.
	var q sentTokens
	at := func(k int) time.Time { return t0.Add(time.Duration(k) * time.Second) }
	q.observe("w", at(0), 30000)
	q.add("w", at(0), 30000, 50000) // another replica's sends are invisible anyway: not counted
	q.observe("w", at(1), 24000)    // fell 6,000
	q.observe("w", at(2), 20000)    // fell 4,000: the peak stays near 6,000
	q.observe("w", at(3), 21000)    // rose: no sample
	q.observe("w", at(4), 0)        // ran dry: no sample
	q.observe("w", at(5), 5000)
	q.observe("w", at(6), 1000) // started below prefillGateTokens: no sample
	if e := q.m["w"]; e.peaks != 2 || e.peak < 5900 || e.peak > 6000 {
		t.Fatalf("peak drain %+v, want about 6,000 from 2 intervals", e)
	}
	if q.speedOf("w", true) != 0 {
		t.Fatal("speedOf(peak) before peakSamples intervals is not 0")
	}
	s.forget("w")
	if s.speedOf("w", false) != 0 {
		t.Fatal("forget left the rate")
	}
}

func TestSpeedWeight(t *testing.T) {
	for _, c := range []struct{ rate, median, want float64 }{
		{0, 8000, 1},          // unmeasured
		{8000, 0, 1},          // nothing measured
		{8000 * 0.8, 8000, 1}, // a uniform engine's noise
		{8000 * 1.3, 8000, 1},
		{4000, 8000, 0.5},
		{8000 * 0.6, 8000, 0.5},
		{16000, 8000, 2},
		{1000, 8000, 0.125},
	} {
		if got := speedWeight(c.rate, c.median); got != c.want {
			t.Errorf("speedWeight(%v, %v) = %v, want %v", c.rate, c.median, got, c.want)
		}
	}
}

// rateLoads reports, per worker id, a backlog that drains at that worker's rate between polls a
// second apart, down to end at poll peakSamples: end + (peakSamples − k)·rate at poll k. Request
// loads are zero.
type rateLoads struct {
	rate     map[string]float64
	end      float64
	poll     *int
	replicas float64
}

func (rateLoads) Load(*worker.Worker) int64 { return 0 }
func (l rateLoads) Report(w *worker.Worker) (loadmon.Report, bool) {
	b := l.end + float64(peakSamples-*l.poll)*l.rate[w.ID]
	return loadmon.Report{WaitingUncachedTokens: int64(b), HasUncachedTokens: true, HasTokenData: true,
		PolledAt: backlogPoll.Add(time.Duration(*l.poll) * time.Second), Replicas: l.replicas}, true
}

// measured returns a cache_aware_hash policy over ws that has watched every worker drain at its
// rate for a few polls down to end tokens each, with no pick in between (nothing sent since any
// poll).
func measured(t *testing.T, ws []*worker.Worker, rate map[string]float64, end, replicas float64) *CacheAwareHash {
	t.Helper()
	poll := 0
	p := newCAH(t, rateLoads{rate: rate, end: end, poll: &poll, replicas: replicas})
	av := candsOf(ws)
	tok := make([]float64, len(ws))
	w := make([]float64, len(ws))
	for poll = 0; poll <= peakSamples; poll++ {
		p.backlogs(av, tok, nil)
		p.weights(av, w)
	}
	poll = peakSamples // keep later reports at the last poll
	return p
}

// TestCacheAwareHashWeighsBySpeed: behind one gateway, once the replica has measured that two of
// eight engines prefill half as fast, a new prompt's rendezvous order is weighted: the slow
// engines own about half the share of keys of the others. With equal speeds, or with several
// replicas, the placement is exactly the unweighted one.
func TestCacheAwareHashWeighsBySpeed(t *testing.T) {
	ws := cahWorkers(t, 8)
	rate := map[string]float64{}
	for i, w := range ws {
		rate[w.ID] = 8000
		if i >= 6 {
			rate[w.ID] = 4000
		}
	}
	const prompts = 4000
	count := func(p *CacheAwareHash) map[string]int {
		n := map[string]int{}
		for i := range prompts {
			n[p.place(candsOf(ws), 0, hashString(prompt(i, "")), true).w.ID]++
		}
		return n
	}
	n := count(measured(t, ws, rate, 100, 1))
	fast, slow := 0, 0
	for i, w := range ws {
		if i >= 6 {
			slow += n[w.ID]
		} else {
			fast += n[w.ID]
		}
	}
	// Shares 1:1:1:1:1:1:½:½ → the slow pair takes 1/7 of the keys (571 of 4,000).
	if got := float64(slow) / prompts; got < 0.11 || got > 0.18 {
		t.Fatalf("mixed fleet: the two slow engines took %.3f of new prompts (fast %d, slow %d), want about 1/7", got, fast, slow)
	}

	// At 8 gateways the replica weighs by the peak fall of the reported backlogs, which needs
	// backlogs of at least prefillGateTokens: the slow pair again takes about 1/7.
	n = count(measured(t, ws, rate, prefillGateTokens, 8))
	slow = n[ws[6].ID] + n[ws[7].ID]
	if got := float64(slow) / prompts; got < 0.11 || got > 0.18 {
		t.Fatalf("mixed fleet, 8 replicas: the two slow engines took %.3f of new prompts, want about 1/7", got)
	}

	plain := count(newCAH(t, cahLoads{}))
	small := map[string]float64{} // the same speeds, but backlogs too small to sample at 8 replicas
	for id, r := range rate {
		small[id] = r / 16
	}
	for name, p := range map[string]*CacheAwareHash{
		"equal speeds":                 measured(t, ws, map[string]float64{}, 100, 1),
		"equal speeds, 8 replicas":     measured(t, ws, map[string]float64{}, prefillGateTokens, 8),
		"small backlogs, 8 replicas":   measured(t, ws, small, 100, 8),
		"uniform within 20 %":          measured(t, ws, map[string]float64{ws[0].ID: 7000, ws[1].ID: 9500}, 100, 1),
		"uniform within 20 %, 8 repl.": measured(t, ws, map[string]float64{ws[0].ID: 7000, ws[1].ID: 9500}, prefillGateTokens, 8),
	} {
		if got := count(p); !equalCounts(got, plain) {
			t.Errorf("%s: placement %v differs from the unweighted %v", name, got, plain)
		}
	}
}

// TestCacheAwareHashBacklogAsWait: the prefill-backlog rule judges a slow engine's backlog as the
// wait it means. Every engine holds the same 10,000 tokens, one prefilling half as fast: its
// backlog counts as 20,000, past the gate (8,192 above the least) and the spill margin, so new
// prompts avoid it; in tokens alone the fleet is not even prefill-bound.
func TestCacheAwareHashBacklogAsWait(t *testing.T) {
	ws := cahWorkers(t, 4)
	rate := map[string]float64{ws[0].ID: 8000, ws[1].ID: 8000, ws[2].ID: 8000, ws[3].ID: 4000}
	p := measured(t, ws, rate, 10000, 1)
	av := candsOf(ws)
	w := make([]float64, len(ws))
	if !p.weights(av, w) || w[3] != 0.5 || w[0] != 1 {
		t.Fatalf("weights %v, want the slow engine at 0.5 and the others at 1", w)
	}
	tok := make([]float64, len(ws))
	if _, ok := p.backlogs(av, tok, nil); ok {
		t.Fatalf("equal backlogs in tokens %v counted as prefill-bound", tok)
	}
	least, ok := p.backlogs(av, tok, w)
	if !ok || least != 10000 || tok[3] != 20000 {
		t.Fatalf("backlogs as waits: %v (least %v, prefill-bound %v), want the slow engine's 10,000 as 20,000", tok, least, ok)
	}
	for i := range 50 {
		if c := p.place(av, 0, hashString(prompt(300+i, "")), true); c.w.ID == ws[3].ID {
			t.Fatalf("prompt %d went to the slow engine, whose backlog means twice the wait", i)
		}
	}
}

func candsOf(ws []*worker.Worker) []cand {
	av := make([]cand, len(ws))
	for i, w := range ws {
		av[i] = cand{w: w}
	}
	return av
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
