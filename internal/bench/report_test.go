package bench

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCollectorSummary(t *testing.T) {
	var c Collector
	for i := 1; i <= 100; i++ {
		c.Add(Record{
			Sent: time.Duration(i) * 10 * time.Millisecond, TTFT: time.Duration(i) * time.Millisecond,
			E2E: time.Duration(i) * 2 * time.Millisecond, ITL: time.Millisecond,
			PromptTokens: 100, CachedTokens: 25, OutputTokens: 10,
		})
	}
	c.Add(Record{Sent: 0, Err: "timeout"})
	s := c.Summarize("x")
	if s.OK != 100 || s.Errors != 1 || s.ErrorKinds["timeout"] != 1 {
		t.Fatalf("counts %+v", s)
	}
	if s.HitRate != 0.25 {
		t.Fatalf("hit rate %v, want 0.25 (token-weighted)", s.HitRate)
	}
	if s.TTFTP50 != 50 || s.TTFTP90 != 90 || s.TTFTP99 != 99 || s.E2EP99 != 198 || s.ITLP50 != 1 {
		t.Fatalf("quantiles %+v", s)
	}
	// Span: first sent at 0 (the error) to the last completion at 1000 ms + 200 ms.
	if s.SpanSec != 1.2 || s.ReqPerSec != 83.333 {
		t.Fatalf("span %v req/s %v", s.SpanSec, s.ReqPerSec)
	}
	if len(s.TTFTQuantiles) != 101 || s.TTFTQuantiles[0] != 1 || s.TTFTQuantiles[100] != 100 {
		t.Fatalf("quantiles %v", s.TTFTQuantiles)
	}
}

func TestReportFormats(t *testing.T) {
	r := Report{
		Title: "t", Command: "kvgate bench",
		Rows:     []Summary{{Label: "round_robin", Gateways: 1, OK: 3, HitRate: 0.5, TTFTP99: 1234, Spread: 1.5}, {Label: "live", OK: 1, Spread: -1}},
		Sweeps:   []SweepResult{{Label: "round_robin", SLOms: 500, Goodput: 12.5}},
		Warnings: []string{"careful"},
	}
	var tb bytes.Buffer
	if err := r.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"round_robin", "1234ms", "1.50", "inf", "12.50", "warning: careful", "$ kvgate bench"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	var jb bytes.Buffer
	if err := r.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(jb.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Rows[0].TTFTP99 != 1234 || back.Sweeps[0].Goodput != 12.5 {
		t.Fatalf("round trip %+v", back)
	}
}

func TestSweepFindsKnee(t *testing.T) {
	// A system whose p99 TTFT is 100 ms below 37/s and explodes above.
	var probes []float64
	run := func(rate float64) (Summary, error) {
		probes = append(probes, rate)
		p99 := 100.0
		if rate > 37 {
			p99 = 5000
		}
		return Summary{OK: 10, TTFTP99: p99, HitRate: 0.5}, nil
	}
	res, err := Sweep("x", SweepConfig{SLO: time.Second, Lo: 1, Hi: 1000, Steps: 8}, run)
	if err != nil {
		t.Fatal(err)
	}
	if res.Goodput > 37 || res.Goodput < 36 {
		t.Fatalf("goodput %v, want just below 37 (probes %v)", res.Goodput, probes)
	}
	if res.HitRate != 0.5 || len(res.Points) != len(probes) {
		t.Fatalf("result %+v", res)
	}
	res, _ = Sweep("x", SweepConfig{SLO: time.Millisecond, Lo: 1, Hi: 10}, run)
	if res.Goodput != 0 || len(res.Points) != 1 {
		t.Fatalf("failing at lo: %+v", res)
	}
	if _, err := Sweep("x", SweepConfig{Lo: 1, Hi: 2}, run); err == nil {
		t.Fatal("missing SLO accepted")
	}
}

func TestChartsRender(t *testing.T) {
	dir := t.TempDir()
	rows := []Summary{
		{Label: "a", Gateways: 1, HitRate: 0.9, TTFTQuantiles: []float64{1, 2, 3}},
		{Label: "a", Gateways: 8, HitRate: 0.7, TTFTQuantiles: []float64{1, 2, 5}},
		{Label: "b", Gateways: 1, HitRate: 0.2},
	}
	cdf := TTFTCDF("TTFT", rows)
	if len(cdf.Series) != 2 {
		t.Fatalf("%d CDF series, want 2 (rows without data skipped)", len(cdf.Series))
	}
	p := filepath.Join(dir, "cdf.png")
	if err := cdf.SavePNG(p); err != nil {
		t.Fatal(err)
	}
	series := ByGateways(rows, func(s Summary) string { return s.Label }, func(s Summary) float64 { return s.HitRate })
	if len(series) != 2 || len(series[0].X) != 2 || series[0].X[1] != 8 {
		t.Fatalf("series %+v", series)
	}
	p2 := filepath.Join(dir, "hit.png")
	if err := (Chart{Title: "hit", Points: true, Series: series}).SavePNG(p2); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{p, p2} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(f); err != nil {
			t.Fatalf("%s is not a PNG: %v", path, err)
		}
		f.Close()
	}
	if err := (Chart{Series: series}).SavePNG(filepath.Join(dir, "x.svg")); err == nil {
		t.Fatal("non-PNG path accepted")
	}
}

// TestTableColumns: a live row's target has its own column, and every column shown is
// explained under the table.
func TestTableColumns(t *testing.T) {
	var b strings.Builder
	live := &Report{Rows: []Summary{{Label: "live", Target: "127.0.0.1:30000", OK: 3, TTFTP99: 12}}}
	if err := live.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	head := strings.Fields(strings.Split(strings.TrimLeft(out, "\n"), "\n")[0])
	if head[0] != "label" || head[1] != "target" || !strings.Contains(out, "live  127.0.0.1:30000") {
		t.Errorf("live table:\n%s", out)
	}
	if strings.Contains(out, "  policy ") || !strings.Contains(out, "  target ") {
		t.Errorf("live column help:\n%s", out)
	}
	b.Reset()
	fleet := &Report{Rows: []Summary{{Label: "round_robin", Policy: "round_robin", Gateways: 2, OK: 3}}}
	if err := fleet.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"policy", "gw", "hit", "ideal", "÷oracle", "TTFT p50", "ITL p50", "E2E p50", "spread", "stall", "batch"} {
		if !strings.Contains(b.String(), "\n  "+h) {
			t.Errorf("column %q is not explained:\n%s", h, b.String())
		}
	}
	if strings.Contains(b.String(), "  target ") {
		t.Errorf("a fleet table explains the live target column:\n%s", b.String())
	}
}

// TestLogTicks: a log axis gets at least three labelled ticks over any range a report draws.
func TestLogTicks(t *testing.T) {
	for _, r := range [][2]float64{{75, 330}, {3, 90000}, {0.5, 0.9}, {10, 10000}, {120, 130}} {
		labels := 0
		for _, tk := range (logTicks{}).Ticks(r[0], r[1]) {
			if tk.Value < r[0]*(1-1e-9) || tk.Value > r[1]*(1+1e-9) {
				t.Errorf("range %v: tick %v outside it", r, tk.Value)
			}
			if tk.Label != "" {
				labels++
			}
		}
		if labels < 2 || (r[1]/r[0] > 2 && labels < 3) {
			t.Errorf("range %v: %d labelled ticks", r, labels)
		}
	}
	if got := formatTick(20000); got != "20000" {
		t.Errorf("formatTick(20000) = %q", got)
	}
}
