package suite

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/fleet"
)

// Row is one grid row: the policy under test against the oracle and the baselines on one
// workload, shape, timing model and seed. Ratios are the policy's figure ÷ the other's (below 1
// is better for times), 0 when a figure is missing.
type Row struct {
	Name   string `json:"name"`
	Timing string `json:"timing"`
	Seed   uint64 `json:"seed"`
	// P99 and OracleP99 are the TTFT p99 at 1 gateway, in milliseconds; Hit the policy's hit
	// rate there.
	P99       float64 `json:"ttft_p99_ms"`
	OracleP99 float64 `json:"oracle_ttft_p99_ms"`
	Hit       float64 `json:"hit_rate"`
	// P99Oracle1 and P99Oracle8 are TTFT p99 ÷ the oracle's at 1 and 8 gateways; MeanOracle1 the
	// mean TTFT ÷ the oracle's at 1 gateway.
	P99Oracle1  float64 `json:"p99_vs_oracle_g1"`
	P99Oracle8  float64 `json:"p99_vs_oracle_g8"`
	MeanOracle1 float64 `json:"mean_vs_oracle_g1"`
	// P99RoundRobin and P99CacheAware are the worse, over 1 and 8 gateways, of TTFT p99 ÷
	// round_robin's and ÷ cache_aware's; SLORoundRobin and SLOCacheAware likewise of the share
	// of requests within the SLO ÷ theirs (above 1 is better).
	P99RoundRobin float64 `json:"p99_vs_round_robin"`
	P99CacheAware float64 `json:"p99_vs_cache_aware"`
	SLORoundRobin float64 `json:"slo_vs_round_robin"`
	SLOCacheAware float64 `json:"slo_vs_cache_aware"`
	// Spread is the policy's load spread (max/min engine backlog), the worse of 1 and 8
	// gateways.
	Spread float64 `json:"load_spread"`
	// Hit8vs1 is the policy's hit rate at 8 gateways ÷ at 1.
	Hit8vs1 float64 `json:"hit_g8_vs_g1"`
	// PreciseVsPolicy is precise_prefix's TTFT p99 ÷ the policy's, the worse of 1 and 8
	// gateways.
	PreciseVsPolicy float64 `json:"precise_p99_vs_policy"`
}

// SplitRow compares the policy's hit rate at 2 gateways split 80/20 with the even split.
type SplitRow struct {
	Name     string  `json:"name"`
	Seed     uint64  `json:"seed"`
	HitEven  float64 `json:"hit_even"`
	HitSplit float64 `json:"hit_80_20"`
	Ratio    float64 `json:"ratio"`
}

// PairRow compares the policy's TTFT p99 at 2 gateways with 1.
type PairRow struct {
	Name   string  `json:"name"`
	Timing string  `json:"timing"`
	Seed   uint64  `json:"seed"`
	P99One float64 `json:"ttft_p99_g1_ms"`
	P99Two float64 `json:"ttft_p99_g2_ms"`
	Ratio  float64 `json:"ratio"`
	// P99Sync is the p99 of 2 gateways sharing their decisions (replica sync, 1 ms bus);
	// RatioSync it over P99One.
	P99Sync   float64 `json:"ttft_p99_g2_sync_ms"`
	RatioSync float64 `json:"ratio_sync"`
}

// SLO is the TTFT objective of the within-SLO shares, in milliseconds.
const SLO = 2000.0

// rowTable finds summaries by policy, gateway count and split.
type rowTable []bench.Summary

func table(rows []bench.Summary) rowTable { return rowTable(rows) }

func (t rowTable) get(pol string, gw int, split string) bench.Summary {
	for _, r := range t {
		if r.Policy == pol && r.Gateways == gw && r.Split == split {
			return r
		}
	}
	return bench.Summary{}
}

func ratio(a, b float64) float64 {
	if b <= 0 || a < 0 {
		return 0
	}
	return math.Round(a/b*1000) / 1000
}

// within returns the share of a row's TTFTs at or below SLO, from its quantiles.
func within(s bench.Summary) float64 {
	q := s.TTFTQuantiles
	if len(q) == 0 {
		return 0
	}
	n := 0
	for _, v := range q {
		if v <= SLO {
			n++
		}
	}
	return float64(n) / float64(len(q))
}

func gridRow(c caseSpec, pol string, t rowTable) Row {
	p1, p8 := t.get(pol, 1, ""), t.get(pol, 8, "")
	o1, o8 := t.get(fleet.OraclePolicy, 1, ""), t.get(fleet.OraclePolicy, 8, "")
	r := Row{Name: c.name, Timing: c.timing.String(), Seed: c.seed, P99: p1.TTFTP99, OracleP99: o1.TTFTP99, Hit: p1.HitRate,
		P99Oracle1: ratio(p1.TTFTP99, o1.TTFTP99), P99Oracle8: ratio(p8.TTFTP99, o8.TTFTP99),
		MeanOracle1: ratio(p1.TTFTMean, o1.TTFTMean), Hit8vs1: ratio(p8.HitRate, p1.HitRate),
		Spread: math.Max(p1.Spread, p8.Spread)}
	if p1.Spread < 0 || p8.Spread < 0 {
		r.Spread = -1
	}
	for _, g := range []int{1, 8} {
		p := t.get(pol, g, "")
		rr, ca, pp := t.get("round_robin", g, ""), t.get("cache_aware", g, ""), t.get("precise_prefix", g, "")
		r.P99RoundRobin = math.Max(r.P99RoundRobin, ratio(p.TTFTP99, rr.TTFTP99))
		r.P99CacheAware = math.Max(r.P99CacheAware, ratio(p.TTFTP99, ca.TTFTP99))
		r.PreciseVsPolicy = math.Max(r.PreciseVsPolicy, ratio(pp.TTFTP99, p.TTFTP99))
		slo := func(b bench.Summary) float64 { return ratio(within(p), within(b)) }
		if g == 1 {
			r.SLORoundRobin, r.SLOCacheAware = slo(rr), slo(ca)
		} else {
			r.SLORoundRobin, r.SLOCacheAware = math.Min(r.SLORoundRobin, slo(rr)), math.Min(r.SLOCacheAware, slo(ca))
		}
	}
	return r
}

// Targets are the cost-model targets the table marks: a figure that misses its target is
// followed by "!".
const Targets = `targets: p99÷oracle ≤ 1.2 at 1 gateway, ≤ 1.35 at 8 (agent rows ≤ 1.5 at both); mean÷oracle ≤ 1.1 at 1 gateway;
p99÷rr and p99÷ca ≤ 1 and slo÷rr and slo÷ca ≥ 1 (never worse than round_robin or cache_aware); spread < 2;
hit 8÷1 ≥ 0.95 (multi-turn and conversation rows); precise÷policy ≤ 1.05; 80/20 split ≥ 0.95 of even; 2 gateways ÷ 1 ≤ 1.2.`

// Legend explains the columns.
const Legend = `columns: p99 and orc p99 are the policy's and the oracle's TTFT p99 at 1 gateway; ÷orc g1, g8 the policy's TTFT p99
÷ the oracle's at 1 and 8 gateways; mean÷orc the mean TTFT ÷ the oracle's at 1 gateway; p99÷rr, p99÷ca the worse over 1
and 8 gateways of the policy's TTFT p99 ÷ round_robin's and cache_aware's; slo÷rr, slo÷ca the worse of its share of
requests with TTFT ≤ 2 s ÷ theirs; spread its load spread (max/min mean engine backlog, the worse of 1 and 8 gateways;
inf: an engine never loaded); hit its token hit rate at 1 gateway; hit 8÷1 at 8 gateways ÷ at 1; precise÷pol
precise_prefix's TTFT p99 ÷ the policy's (the worse of 1 and 8 gateways).`

// WriteTable prints the result as tables with the targets marked.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "cost-model suite: %s against the oracle, %s; 1 and 8 gateways\n\n", r.Policy, strings.Join(Baselines, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\ttiming\tseed\tp99\torc p99\t÷orc g1\tg8\tmean÷orc\tp99÷rr\tp99÷ca\tslo÷rr\tslo÷ca\tspread\thit\thit 8÷1\tprecise÷pol\t")
	for _, x := range r.Rows {
		agent := strings.HasPrefix(x.Name, "agent")
		g1, g8 := 1.2, 1.35
		if agent {
			g1, g8 = 1.5, 1.5
		}
		hitTarget := strings.HasPrefix(x.Name, "multi-turn") || strings.HasPrefix(x.Name, "conversation")
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%s\t\n", x.Name, x.Timing, x.Seed,
			msCell(x.P99), msCell(x.OracleP99),
			mark(x.P99Oracle1, x.P99Oracle1 <= g1), mark(x.P99Oracle8, x.P99Oracle8 <= g8), mark(x.MeanOracle1, agent || x.MeanOracle1 <= 1.1),
			mark(x.P99RoundRobin, x.P99RoundRobin <= 1), mark(x.P99CacheAware, x.P99CacheAware <= 1),
			mark(x.SLORoundRobin, x.SLORoundRobin >= 1), mark(x.SLOCacheAware, x.SLOCacheAware >= 1),
			spreadCell(x.Spread), x.Hit, mark(x.Hit8vs1, !hitTarget || x.Hit8vs1 >= 0.95), mark(x.PreciseVsPolicy, x.PreciseVsPolicy <= 1.05))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Splits) > 0 {
		fmt.Fprintln(w, "\nhit rate at 2 gateways, traffic split 80/20 against an even split (policy under test, batched timing, 8 engines)")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "row\tseed\thit even\thit 80/20\t80/20÷even\t")
		for _, x := range r.Splits {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%s\t\n", x.Name, x.Seed, x.HitEven, x.HitSplit, mark(x.Ratio, x.Ratio >= 0.95))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Replicas) > 0 {
		fmt.Fprintln(w, "\nTTFT p99 behind 2 gateways against 1 (policy under test)")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "row\ttiming\tseed\tp99 g1\tp99 g2\tg2÷g1\tp99 g2 sync\tsync÷g1\t")
		for _, x := range r.Replicas {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", x.Name, x.Timing, x.Seed, msCell(x.P99One), msCell(x.P99Two),
				mark(x.Ratio, x.Ratio <= 1.2), msCell(x.P99Sync), mark(x.RatioSync, x.RatioSync <= 1.2))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "\nskipped %s", s)
	}
	_, err := fmt.Fprintf(w, "\n%s\n%s\n", Legend, Targets)
	return err
}

// mark prints a ratio, followed by "!" when it misses its target.
func mark(v float64, ok bool) string {
	if v == 0 {
		return "-"
	}
	if ok {
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.3f!", v)
}

func msCell(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1fs", v/1000)
	}
	return fmt.Sprintf("%.0fms", v)
}

func spreadCell(v float64) string {
	switch {
	case v < 0:
		return "inf!"
	case v >= 2:
		return fmt.Sprintf("%.2f!", v)
	}
	return fmt.Sprintf("%.2f", v)
}
