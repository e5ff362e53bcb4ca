package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// Timeline buckets records by the time they were sent, to show how a run changes over time (a
// worker removed, a worker added). Set Collector.Timeline to fill one; every record is counted,
// warm-up included. Not safe for concurrent use (the Collector's owner serialises Add).
type Timeline struct {
	// Bucket is the width of one window. Must be positive.
	Bucket time.Duration

	windows []window
}

// window is one bucket's accumulated figures.
type window struct {
	ok, errs       int
	prompt, cached int64
	ttft           []float64
	byWorker       map[string]*WorkerWindow
}

// WorkerWindow is one worker's share of a window.
type WorkerWindow struct {
	// Requests counts the requests the worker answered (successes).
	Requests int `json:"requests"`
	// PromptTokens and CachedTokens are their token sums.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// TimelinePoint is one window of a timeline.
type TimelinePoint struct {
	// At is the window's start, in seconds from the run's start.
	At float64 `json:"t_s"`
	// OK and Errors count the requests sent in the window, by outcome.
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	// HitRate is the window's token-weighted hit rate.
	HitRate float64 `json:"hit_rate"`
	// PromptTokens and CachedTokens are the sums behind HitRate.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	// TTFTP50 and TTFTP99 are in milliseconds.
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
	// Workers splits the window by the worker that answered, when records name it (fleet runs,
	// and live runs through a gateway with --audit-headers).
	Workers map[string]WorkerWindow `json:"workers,omitempty"`
}

// Add accounts r in the window of r.Sent.
func (t *Timeline) Add(r Record) {
	if t.Bucket <= 0 || r.Sent < 0 {
		return
	}
	i := int(r.Sent / t.Bucket)
	for len(t.windows) <= i {
		t.windows = append(t.windows, window{})
	}
	w := &t.windows[i]
	if r.Err != "" {
		w.errs++
		return
	}
	w.ok++
	w.prompt += int64(r.PromptTokens)
	w.cached += int64(r.CachedTokens)
	w.ttft = append(w.ttft, ms(r.TTFT))
	if r.Worker != "" {
		if w.byWorker == nil {
			w.byWorker = map[string]*WorkerWindow{}
		}
		ww := w.byWorker[r.Worker]
		if ww == nil {
			ww = &WorkerWindow{}
			w.byWorker[r.Worker] = ww
		}
		ww.Requests++
		ww.PromptTokens += int64(r.PromptTokens)
		ww.CachedTokens += int64(r.CachedTokens)
	}
}

// Points returns the windows in time order.
func (t *Timeline) Points() []TimelinePoint {
	out := make([]TimelinePoint, len(t.windows))
	for i := range t.windows {
		w := &t.windows[i]
		p := TimelinePoint{At: round(float64(i)*t.Bucket.Seconds(), 3), OK: w.ok, Errors: w.errs, PromptTokens: w.prompt, CachedTokens: w.cached}
		if w.prompt > 0 {
			p.HitRate = round(float64(w.cached)/float64(w.prompt), 4)
		}
		slices.Sort(w.ttft)
		p.TTFTP50, p.TTFTP99 = quantile(w.ttft, 0.5), quantile(w.ttft, 0.99)
		if len(w.byWorker) > 0 {
			p.Workers = make(map[string]WorkerWindow, len(w.byWorker))
			for k, v := range w.byWorker {
				p.Workers[k] = *v
			}
		}
		out[i] = p
	}
	return out
}

// Recovery says how a timeline came back after an event at At: the hit rate it should have
// had, the worst window after it, and how long until the hit rate was back within Tolerance
// (relative) of that for good.
type Recovery struct {
	// Event names what happened (e.g. "remove engine-3"); At is when, in seconds.
	Event string  `json:"event"`
	At    float64 `json:"t_s"`
	// Steady is the reference hit rate: with a baseline (the same run without the change, in
	// the deterministic fleet simulator), the baseline's over the span after At; without one,
	// the run's own from the steady-state start to At.
	Steady float64 `json:"steady_hit_rate"`
	// Baseline is true when Steady and the per-window comparison come from a baseline run.
	Baseline bool `json:"baseline,omitempty"`
	// Worst is the lowest smoothed hit rate from At to the end of the span looked at, relative
	// to the reference (1: no loss).
	Worst float64 `json:"worst_relative_hit"`
	// RecoverySec is the time from At to the start of the first window from which every smoothed
	// window up to the end of the span is within Tolerance of the reference; 0 when it never
	// left it, -1 if it never came back.
	RecoverySec float64 `json:"recovery_s"`
	// Tolerance is the relative tolerance used (0.02: within 2 %).
	Tolerance float64 `json:"tolerance"`
	// Errors counts failed requests sent in the span.
	Errors int `json:"errors"`
	// TTFTP99Before and TTFTP99After are the worst window TTFT p99 before and after At (ms).
	TTFTP99Before float64 `json:"ttft_p99_before_ms"`
	TTFTP99After  float64 `json:"ttft_p99_after_ms"`
	// Added names the worker the event added ("" for a removal); AddedShare is the share of the
	// span's requests it answered, OthersHit the hit rate of every other worker over the span.
	Added      string  `json:"added,omitempty"`
	AddedShare float64 `json:"added_share,omitempty"`
	OthersHit  float64 `json:"others_hit_rate,omitempty"`
}

// smoothWindows is how many windows (the current and the ones before) a smoothed hit rate
// pools: one window of a few hundred requests varies by several percent on its own.
const smoothWindows = 3

// smoothed returns the token-weighted hit rate of points[i-smoothWindows+1..i], not reaching
// before index lo.
func smoothed(points []TimelinePoint, lo, i int) float64 {
	var p, c int64
	for k := max(lo, i-smoothWindows+1); k <= i && k < len(points); k++ {
		p, c = p+points[k].PromptTokens, c+points[k].CachedTokens
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

// RecoveryAfter analyses points for an event at at (seconds): the span runs from at to until
// (≤ 0: the end). base, when not nil, is the same run without the change, window for window;
// without it the reference is the hit rate from from to at. added, when not "", names the
// worker the event added.
func RecoveryAfter(points, base []TimelinePoint, event, added string, from, at, until, tol float64) Recovery {
	r := Recovery{Event: event, At: at, Tolerance: tol, Worst: math.Inf(1), RecoverySec: -1, Added: added, Baseline: base != nil}
	var p, c int64
	first, last := -1, -1 // the span's windows
	for i, pt := range points {
		switch {
		case pt.At >= from && pt.At < at:
			p, c = p+pt.PromptTokens, c+pt.CachedTokens
			r.TTFTP99Before = max(r.TTFTP99Before, pt.TTFTP99)
		case pt.At >= at && (until <= 0 || pt.At < until) && pt.OK+pt.Errors > 0:
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if p > 0 {
		r.Steady = round(float64(c)/float64(p), 4)
	}
	if first < 0 {
		r.Worst = 0
		return r
	}
	// The last window may be part-empty (the run ends): it counts only if it has at least half
	// the requests of the span's median window.
	counts := make([]int, 0, last-first+1)
	for _, pt := range points[first : last+1] {
		counts = append(counts, pt.OK)
	}
	sort.Ints(counts)
	if last > first && points[last].OK*2 < counts[len(counts)/2] {
		last--
	}
	if base != nil {
		var bp, bc int64
		for i := first; i <= last && i < len(base); i++ {
			bp, bc = bp+base[i].PromptTokens, bc+base[i].CachedTokens
		}
		if bp > 0 {
			r.Steady = round(float64(bc)/float64(bp), 4)
		}
	}
	ref := func(i int) float64 {
		if base != nil && i < len(base) {
			return smoothed(base, first, i)
		}
		return r.Steady
	}
	var n, nAdded int
	var op, oc int64
	ok := make([]bool, 0, last-first+1)
	for i := first; i <= last; i++ {
		pt := points[i]
		r.Errors += pt.Errors
		r.TTFTP99After = max(r.TTFTP99After, pt.TTFTP99)
		rel := 1.0
		if f := ref(i); f > 0 {
			rel = smoothed(points, first, i) / f
		}
		r.Worst = min(r.Worst, round(rel, 4))
		ok = append(ok, rel >= 1-tol)
		n += pt.OK
		for id, ww := range pt.Workers {
			if id == added {
				nAdded += ww.Requests
				continue
			}
			op, oc = op+ww.PromptTokens, oc+ww.CachedTokens
		}
	}
	// Recovered from the first window after the last one out of tolerance.
	r.RecoverySec = 0
	for k := len(ok) - 1; k >= 0; k-- {
		if !ok[k] {
			if k == len(ok)-1 {
				r.RecoverySec = -1
			} else {
				r.RecoverySec = round(points[first+k+1].At-at, 3)
			}
			break
		}
	}
	if added != "" && n > 0 {
		r.AddedShare = round(float64(nAdded)/float64(n), 4)
	}
	if added != "" && op > 0 {
		r.OthersHit = round(float64(oc)/float64(op), 4)
	}
	return r
}

// String formats r on one line.
func (r Recovery) String() string {
	rec := "never"
	if r.RecoverySec >= 0 {
		rec = fmt.Sprintf("%.0f s", r.RecoverySec)
	}
	ref := "steady hit"
	if r.Baseline {
		ref = "undisturbed hit"
	}
	s := fmt.Sprintf("%s at %.0f s: %s %.3f, worst %.1f%% of it, back within %.0f%% after %s, %d errors, TTFT p99 %s before / %s after",
		r.Event, r.At, ref, r.Steady, r.Worst*100, r.Tolerance*100, rec, r.Errors, fmtMS(r.TTFTP99Before), fmtMS(r.TTFTP99After))
	if r.Added != "" {
		s += fmt.Sprintf("; %s took %.1f%% of requests, the others' hit rate %.3f", r.Added, r.AddedShare*100, r.OthersHit)
	}
	return s
}

// TimelineCharts returns two charts of rows' timelines: hit rate and TTFT p99 against time,
// one series per row, one per row's undisturbed run when it has one, and a vertical line at
// each worker change of the first row that has changes.
func TimelineCharts(title string, rows []Summary) (hit, p99 Chart) {
	hit = Chart{Title: "Hit rate over time: " + title, XLabel: "time (s)", YLabel: "token-weighted hit rate (window)"}
	p99 = Chart{Title: "TTFT p99 over time: " + title, XLabel: "time (s)", YLabel: "TTFT p99 per window (ms, log scale)", LogY: true}
	loH, hiH, loQ, hiQ := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	add := func(label string, pts []TimelinePoint) {
		h, q := Series{Label: label}, Series{Label: label}
		for _, pt := range pts {
			if pt.OK == 0 {
				continue
			}
			y := max(pt.TTFTP99, 0.001)
			h.X, h.Y = append(h.X, pt.At), append(h.Y, pt.HitRate)
			q.X, q.Y = append(q.X, pt.At), append(q.Y, y)
			loH, hiH, loQ, hiQ = min(loH, pt.HitRate), max(hiH, pt.HitRate), min(loQ, y), max(hiQ, y)
		}
		if len(h.X) > 0 {
			hit.Series = append(hit.Series, h)
			p99.Series = append(p99.Series, q)
		}
	}
	var events []Recovery
	for _, r := range rows {
		add(r.Label, r.Timeline)
		if len(r.Undisturbed) > 0 {
			add(r.Label+" undisturbed", r.Undisturbed)
		}
		if events == nil {
			events = r.Recoveries
		}
	}
	if len(hit.Series) == 0 {
		return hit, p99
	}
	for _, e := range events {
		label := fmt.Sprintf("%s (%.0f s)", e.Event, e.At)
		hit.Series = append(hit.Series, Series{Label: label, X: []float64{e.At, e.At}, Y: []float64{loH, hiH}})
		p99.Series = append(p99.Series, Series{Label: label, X: []float64{e.At, e.At}, Y: []float64{loQ, hiQ}})
	}
	return hit, p99
}
