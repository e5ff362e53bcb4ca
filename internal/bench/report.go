package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Record is the outcome of one request.
type Record struct {
	// Sent is when the request was sent, as an offset from the start of the run.
	Sent time.Duration
	// TTFT is the time to the first content token; E2E the time to the last byte. Zero on error.
	TTFT, E2E time.Duration
	// ITL is the mean gap between content tokens after the first; zero with fewer than two.
	ITL time.Duration
	// PromptTokens, CachedTokens and OutputTokens are as the server reported them (usage), or as
	// the simulated engine counted them.
	PromptTokens, CachedTokens, OutputTokens int
	// Err is the failure; "" on success.
	Err string
	// Worker names the worker that answered, when known (fleet runs; live runs through a
	// gateway with --audit-headers); "" otherwise.
	Worker string
	// Predicted is the share of the prompt the routing policy expected cached; meaningful when
	// HasPrediction (fleet runs of policies with a prefix tree; live runs with audit headers).
	Predicted     float64
	HasPrediction bool
}

// Collector accumulates records into the figures of a Summary without keeping the records: a
// simulated hour of a large fleet is millions of requests. Not safe for concurrent use.
type Collector struct {
	// Warmup: records sent before this offset are counted in Skipped and otherwise ignored.
	Warmup time.Duration
	// Skipped counts the records ignored as warm-up.
	Skipped int

	ttft, e2e, itl []float64 // milliseconds
	ok, errs       int
	prompt, cached int64
	output         int64
	first, last    time.Duration
	errKinds       map[string]int
	predN          int
	predAbs, predE float64

	// Timeline, when set, also receives every record, warm-up included.
	Timeline *Timeline
}

// Add accounts one finished request; end is its completion offset from the start of the run.
func (c *Collector) Add(r Record) {
	if c.Timeline != nil {
		c.Timeline.Add(r)
	}
	if r.Sent < c.Warmup {
		c.Skipped++
		return
	}
	end := r.Sent + r.E2E
	if c.ok+c.errs == 0 || r.Sent < c.first {
		c.first = r.Sent
	}
	c.last = max(c.last, end)
	if r.Err != "" {
		c.errs++
		if c.errKinds == nil {
			c.errKinds = map[string]int{}
		}
		if len(c.errKinds) < 16 {
			c.errKinds[r.Err]++
		}
		return
	}
	c.ok++
	c.prompt += int64(r.PromptTokens)
	c.cached += int64(r.CachedTokens)
	c.output += int64(r.OutputTokens)
	if r.HasPrediction && r.PromptTokens > 0 {
		e := r.Predicted - float64(r.CachedTokens)/float64(r.PromptTokens)
		c.predN++
		c.predAbs += math.Abs(e)
		c.predE += e
	}
	c.ttft = append(c.ttft, ms(r.TTFT))
	c.e2e = append(c.e2e, ms(r.E2E))
	if r.OutputTokens > 1 {
		c.itl = append(c.itl, ms(r.ITL))
	}
}

// Count returns the number of records added.
func (c *Collector) Count() int { return c.ok + c.errs }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Summary is one row of a report: how one configuration (a policy, at a number of gateways, on a
// workload) performed. Times are in milliseconds; rates per second of the run's span (from the
// first request sent to the last one finished).
type Summary struct {
	// Label names the row (the policy, plus any variant such as "effective g=8").
	Label string `json:"label"`
	// Policy is the canonical policy name; "" for a live run against an opaque target.
	Policy string `json:"policy,omitempty"`
	// Workload and Arrivals say what was offered.
	Workload string `json:"workload"`
	Arrivals string `json:"arrivals"`
	// Gateways and Engines describe a simulated fleet; zero for a live run.
	Gateways int `json:"gateways,omitempty"`
	Engines  int `json:"engines,omitempty"`
	// Split is how traffic was split over the gateways when not evenly (for example "80/20").
	Split string `json:"split,omitempty"`
	// Target is the endpoint a live run measured (host and path); "" for a simulated run.
	Target string `json:"target,omitempty"`
	// LoadMode is the load signal the policy read (effective, local, snapshot, max).
	LoadMode string `json:"load_mode,omitempty"`

	// OK and Errors count the measured requests by outcome.
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	// ErrorKinds counts failures by message (at most 16 distinct messages).
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// SpanSec is the measured span in seconds; ReqPerSec and OutTokSec are successful requests
	// and output tokens per second of it.
	SpanSec   float64 `json:"span_s"`
	ReqPerSec float64 `json:"req_per_s"`
	OutTokSec float64 `json:"output_tok_per_s"`
	// HitRate is the token-weighted prefix-cache hit rate: cached prompt tokens / prompt tokens.
	HitRate float64 `json:"hit_rate"`
	// PromptTokens and CachedTokens are the sums behind HitRate.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	// TTFTMean and E2EMean are arithmetic means (what queueing formulas predict).
	TTFTMean float64 `json:"ttft_mean_ms"`
	E2EMean  float64 `json:"e2e_mean_ms"`
	TTFTP50  float64 `json:"ttft_p50_ms"`
	TTFTP90  float64 `json:"ttft_p90_ms"`
	TTFTP99  float64 `json:"ttft_p99_ms"`
	// ITLP50 is the median over requests of each request's mean inter-token latency.
	ITLP50 float64 `json:"itl_p50_ms"`
	// E2EP50 and E2EP99 are end-to-end latency percentiles.
	E2EP50 float64 `json:"e2e_p50_ms"`
	E2EP99 float64 `json:"e2e_p99_ms"`
	// IdealHitRate is the workload's ideal hit rate (Ideal: one engine with an infinite cache
	// sent the same requests in the same order); simulated runs only.
	IdealHitRate float64 `json:"ideal_hit_rate,omitempty"`
	// HitVsOracle and GoodputVsOracle are this row's hit rate (and goodput, in a sweep) as a
	// fraction of the oracle's in the same grid at the same gateway count; 0 without an oracle row.
	HitVsOracle float64 `json:"hit_vs_oracle,omitempty"`
	// Spread is max/min over engines of the time-averaged backlog (running + waiting); 0 when
	// unknown (live runs), +Inf is reported as -1 (an engine that was never loaded).
	Spread float64 `json:"load_spread,omitempty"`
	// SpreadCV is the coefficient of variation over engines of the time-averaged backlog;
	// simulated runs only.
	SpreadCV float64 `json:"load_cv,omitempty"`
	// Stall is the share of engine time by which decoding was held up behind prefill: steps with
	// decoding requests that ran longer than their decode cost because of the prefill chunk
	// they carried (engine.Load.DecodeStall), summed over engines ÷ (engines × run time).
	// Batch is the mean number of running requests per engine, sampled at every poll round.
	// Simulated runs only.
	Stall float64 `json:"decode_stall_share,omitempty"`
	Batch float64 `json:"mean_batch,omitempty"`
	// Decisions counts the policy's decisions by branch (cache_hit, cache_miss, imbalanced, …),
	// summed over gateways; simulated runs of policies that count them only.
	Decisions map[string]uint64 `json:"decisions,omitempty"`
	// TTFTQuantiles holds TTFT at quantiles 0, 0.01, …, 1 (101 values) for CDF charts.
	TTFTQuantiles []float64 `json:"ttft_quantiles_ms,omitempty"`
	// Predicted counts the successful requests whose policy predicted a cached share;
	// PredictionMAE is the mean absolute error of that prediction against the reported share
	// (cached/prompt tokens), PredictionBias its mean signed error (positive: optimistic).
	Predicted      int     `json:"predicted,omitempty"`
	PredictionMAE  float64 `json:"prediction_mae,omitempty"`
	PredictionBias float64 `json:"prediction_bias,omitempty"`
	// Timeline is the run windowed by send time, when one was asked for.
	Timeline []TimelinePoint `json:"timeline,omitempty"`
	// Recoveries analyse the timeline around worker changes (fleet and live failover runs).
	Recoveries []Recovery `json:"recoveries,omitempty"`
	// Undisturbed is the timeline of the same simulated run without its worker changes, the
	// reference of Recoveries (fleet failover runs).
	Undisturbed []TimelinePoint `json:"undisturbed_timeline,omitempty"`
	// Warm counts the warm-ups of added engines (fleet runs with warming on); nil when none.
	Warm *WarmStats `json:"warm,omitempty"`
}

// Summarize turns the collected figures into a row labelled label.
func (c *Collector) Summarize(label string) Summary {
	s := Summary{Label: label, OK: c.ok, Errors: c.errs, PromptTokens: c.prompt, CachedTokens: c.cached}
	if len(c.errKinds) > 0 {
		s.ErrorKinds = make(map[string]int, len(c.errKinds))
		for k, v := range c.errKinds {
			s.ErrorKinds[k] = v
		}
	}
	span := (c.last - c.first).Seconds()
	s.SpanSec = round(span, 3)
	if span > 0 {
		s.ReqPerSec = round(float64(c.ok)/span, 3)
		s.OutTokSec = round(float64(c.output)/span, 1)
	}
	if c.prompt > 0 {
		s.HitRate = round(float64(c.cached)/float64(c.prompt), 4)
	}
	if c.predN > 0 {
		s.Predicted = c.predN
		s.PredictionMAE = round(c.predAbs/float64(c.predN), 4)
		s.PredictionBias = round(c.predE/float64(c.predN), 4)
	}
	if c.Timeline != nil {
		s.Timeline = c.Timeline.Points()
	}
	s.TTFTMean, s.E2EMean = round(mean(c.ttft), 3), round(mean(c.e2e), 3)
	slices.Sort(c.ttft)
	slices.Sort(c.e2e)
	slices.Sort(c.itl)
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = quantile(c.ttft, 0.5), quantile(c.ttft, 0.9), quantile(c.ttft, 0.99)
	s.ITLP50 = quantile(c.itl, 0.5)
	s.E2EP50, s.E2EP99 = quantile(c.e2e, 0.5), quantile(c.e2e, 0.99)
	if len(c.ttft) > 0 {
		s.TTFTQuantiles = make([]float64, 101)
		for i := range s.TTFTQuantiles {
			s.TTFTQuantiles[i] = quantile(c.ttft, float64(i)/100)
		}
	}
	return s
}

// mean returns the arithmetic mean of xs, 0 if empty.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// quantile returns the nearest-rank q-quantile of sorted xs, rounded to microseconds; 0 if empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return round(sorted[i], 3)
}

// round rounds x to d decimals, so that reports do not carry float noise.
func round(x float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(x*p) / p
}

// Report is the whole output of a bench run: rows, goodput sweeps and warnings.
type Report struct {
	// Title says what was run.
	Title string `json:"title"`
	// Command is the command line that produced the report, for reproduction.
	Command string `json:"command,omitempty"`
	// Rows are the summaries, in run order.
	Rows []Summary `json:"rows"`
	// Sweeps are goodput searches, one per row label, when a sweep was run.
	Sweeps []SweepResult `json:"sweeps,omitempty"`
	// Warnings are caveats found while running (client bottleneck, errors).
	Warnings []string `json:"warnings,omitempty"`
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r as aligned text tables: the rows, then the sweeps, then the warnings.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	if r.Title != "" {
		fmt.Fprintf(&b, "%s\n", r.Title)
	}
	if r.Command != "" {
		fmt.Fprintf(&b, "$ %s\n", r.Command)
	}
	if len(r.Rows) > 0 {
		b.WriteByte('\n')
		if err := writeRows(&b, r.Rows); err != nil {
			return err
		}
	}
	if err := writeAccuracy(&b, r.Rows); err != nil {
		return err
	}
	if len(r.Sweeps) > 0 {
		b.WriteByte('\n')
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tSLO TTFT p99\tgoodput req/s\t÷oracle\thit at goodput\tprobes\t")
		for _, s := range r.Sweeps {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%.3f\t%d\t\n", s.Label, fmtMS(s.SLOms), s.Goodput, fmtRatio(s.GoodputVsOracle), s.HitRate, len(s.Points))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(&b, "\nwarning: %s", wn)
	}
	if len(r.Warnings) > 0 {
		b.WriteByte('\n')
	}
	if len(r.Rows) > 0 {
		b.WriteString("\n" + ColumnHelp(r.Rows))
	}
	if hasPrediction(r.Rows) {
		b.WriteString(PredictionHelp())
	}
	if len(r.Sweeps) > 0 {
		b.WriteString(SweepHelp())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRows writes the main table: one line per row. A live row names its target in a column
// of its own; a simulated row names its policy.
func writeRows(b *strings.Builder, rows []Summary) error {
	live := false
	for _, s := range rows {
		live = live || s.Target != ""
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\tgw\t"
	if live {
		head = "label\ttarget\t"
	}
	fmt.Fprintln(tw, head+"ok\terr\treq/s\tout tok/s\thit\tideal\t÷oracle\tTTFT p50\tp90\tp99\tITL p50\tE2E p50\tp99\tspread\tstall\tbatch\t")
	for _, s := range rows {
		second := "-"
		switch {
		case live:
			second = s.Target
		case s.Gateways > 0:
			second = fmt.Sprint(s.Gateways)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			s.Label, second, s.OK, s.Errors, s.ReqPerSec, s.OutTokSec, s.HitRate, fmtRatio(s.IdealHitRate), fmtRatio(s.HitVsOracle),
			fmtMS(s.TTFTP50), fmtMS(s.TTFTP90), fmtMS(s.TTFTP99), fmtMS(s.ITLP50),
			fmtMS(s.E2EP50), fmtMS(s.E2EP99), fmtSpread(s.Spread), fmtRatio(s.Stall), fmtBatch(s.Batch))
	}
	return tw.Flush()
}

// Columns explains every column of the main table, in order: what `kvgate bench -h` prints and
// what ColumnHelp selects from.
var Columns = [][2]string{
	{"policy", "the routing policy (fleet), with its variant: +sticky, +warm, /LOAD-MODE when not the gateway's default, split W/W"},
	{"label", "the row's name (live: --label)"},
	{"target", "the endpoint a live row measured"},
	{"gw", "gateway replicas in front of the engines (fleet)"},
	{"ok, err", "measured requests that succeeded and failed (warm-up requests are not measured)"},
	{"req/s, out tok/s", "successful requests and output tokens per second of the measured span"},
	{"hit", "token-weighted prefix-cache hit rate: cached prompt tokens ÷ prompt tokens, as the engines reported them"},
	{"ideal", "the hit rate of one engine with an infinite cache sent every request in the same order: no router can beat it (fleet)"},
	{"÷oracle", "hit ÷ the oracle's hit at the same gateway count, when the grid has an oracle row (fleet)"},
	{"TTFT p50, p90, p99", "time to first token percentiles over successful requests"},
	{"ITL p50", "the median over requests of each request's mean inter-token latency"},
	{"E2E p50, p99", "end-to-end latency percentiles (send to last token)"},
	{"spread", "load spread: max ÷ min over engines of the time-averaged backlog (running + waiting); inf when an engine never had work (fleet)"},
	{"stall", "share of engine time decoding waited behind prefill: steps that ran longer than their decode cost because of the prefill chunk they carried (fleet, batched timing)"},
	{"batch", "mean running requests per engine, sampled at every poll (fleet)"},
}

// PredictionColumns explain the prediction table (rows whose policy predicts a cached share).
var PredictionColumns = [][2]string{
	{"predicted, of ok", "successful requests whose policy predicted a cached share, of all successful ones"},
	{"MAE", "mean absolute error of the predicted share against the engine's reported cached ÷ prompt tokens"},
	{"bias", "mean signed error of that prediction (positive: the policy expected more hits than it got)"},
}

// SweepColumns explain the goodput table of --sweep.
var SweepColumns = [][2]string{
	{"SLO TTFT p99", "the objective a rate must meet (--slo)"},
	{"goodput req/s", "the highest offered rate found whose TTFT p99 met the SLO with under 0.1 % errors"},
	{"÷oracle", "goodput ÷ the oracle's at the same gateway count"},
	{"hit at goodput", "the hit rate at that rate"},
	{"probes", "rates simulated by the search"},
}

// PredictionHelp explains the prediction table's columns.
func PredictionHelp() string { return helpLines("prediction columns", PredictionColumns) }

// SweepHelp explains the sweep table's columns.
func SweepHelp() string { return helpLines("sweep columns", SweepColumns) }

func hasPrediction(rows []Summary) bool {
	for _, s := range rows {
		if s.Predicted > 0 {
			return true
		}
	}
	return false
}

func helpLines(title string, cols [][2]string) string {
	var b strings.Builder
	b.WriteString(title + ":\n")
	for _, c := range cols {
		fmt.Fprintf(&b, "  %-20s %s\n", c[0], c[1])
	}
	return b.String()
}

// ColumnHelp explains the columns the rows' table shows (all of them when rows is nil).
func ColumnHelp(rows []Summary) string {
	live, fleet := rows == nil, rows == nil
	for _, s := range rows {
		live = live || s.Target != ""
		fleet = fleet || s.Target == ""
	}
	var b strings.Builder
	b.WriteString("columns:\n")
	for _, c := range Columns {
		switch c[0] {
		case "policy", "gw":
			if !fleet || live && rows != nil {
				continue
			}
		case "label", "target":
			if !live {
				continue
			}
		}
		fmt.Fprintf(&b, "  %-20s %s\n", c[0], c[1])
	}
	return b.String()
}

// fmtMS formats milliseconds with a unit that keeps three significant figures readable.
func fmtMS(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fs", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.2fms", v)
}

// fmtRatio formats a ratio, "-" when unknown (zero).
func fmtRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

// fmtBatch formats a mean batch size, "-" when unknown (zero).
func fmtBatch(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func fmtSpread(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 0:
		return "inf"
	}
	return fmt.Sprintf("%.2f", v)
}

// writeAccuracy writes the prediction-accuracy table and the failover recoveries of the rows
// that have them.
func writeAccuracy(b *strings.Builder, rows []Summary) error {
	var pred, rec bool
	for _, s := range rows {
		pred = pred || s.Predicted > 0
		rec = rec || len(s.Recoveries) > 0
	}
	if pred {
		b.WriteString("\nprediction of the cached share (predicted − reported, per request)\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tgw\tpredicted\tof ok\tMAE\tbias\t")
		for _, s := range rows {
			if s.Predicted == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.3f\t%+.3f\t\n", s.Label, s.Gateways, s.Predicted, s.OK, s.PredictionMAE, s.PredictionBias)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if rec {
		b.WriteString("\nfailover\n")
		for _, s := range rows {
			for _, r := range s.Recoveries {
				fmt.Fprintf(b, "%s: %s\n", s.Label, r)
			}
			if s.Warm != nil {
				fmt.Fprintf(b, "%s: %s\n", s.Label, s.Warm)
			}
		}
	}
	return nil
}

// WarmStats counts the warm-up requests a fleet run sent to the engines it added
// (policy.PlanWarm): none of them is a client request, so none is in the run's figures.
type WarmStats struct {
	// Sent counts warm requests sent; Failed those that did not succeed in time (or whose
	// worker left); Recorded the prefixes recorded for their new worker.
	Sent     int `json:"sent"`
	Failed   int `json:"failed"`
	Recorded int `json:"recorded"`
	// PromptTokens and CachedTokens are the engines' counts for the warm requests.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// String summarizes the warm-ups on one line.
func (w WarmStats) String() string {
	return fmt.Sprintf("warm-up: %d requests, %d failed, %d prefixes recorded, %d prompt tokens (%d cached)",
		w.Sent, w.Failed, w.Recorded, w.PromptTokens, w.CachedTokens)
}
