package bench

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line of a chart.
type Series struct {
	// Label names the series in the legend.
	Label string
	// X and Y are the points, of equal length.
	X, Y []float64
}

// Chart describes a line chart.
type Chart struct {
	// Title, XLabel and YLabel are the chart's texts.
	Title, XLabel, YLabel string
	// LogX and LogY draw an axis on a log scale (its values must then be > 0).
	LogX, LogY bool
	// Points draws a marker at each point (for charts with few points).
	Points bool
	// Series are the lines, drawn in order with distinct colours (a qualitative palette) and
	// named in a legend to the right of the data.
	Series []Series
}

// palette is Tableau 10, a qualitative palette whose colours stay distinguishable side by side
// (and for most colour-blind readers); series past the tenth reuse it with dashes.
var palette = []color.NRGBA{
	{0x4e, 0x79, 0xa7, 0xff}, {0xf2, 0x8e, 0x2b, 0xff}, {0xe1, 0x57, 0x59, 0xff}, {0x76, 0xb7, 0xb2, 0xff},
	{0x59, 0xa1, 0x4f, 0xff}, {0xed, 0xc9, 0x48, 0xff}, {0xb0, 0x7a, 0xa1, 0xff}, {0xff, 0x9d, 0xa7, 0xff},
	{0x9c, 0x75, 0x5f, 0xff}, {0x79, 0x70, 0x6e, 0xff},
}

// SavePNG renders c to path (which must end in .png): a 16 × 10 cm plot with its legend to
// the right, outside the data.
func (c Chart) SavePNG(path string) error {
	if !strings.EqualFold(filepath.Ext(path), ".png") {
		return fmt.Errorf("chart %s: want a .png path", path)
	}
	if len(c.Series) == 0 {
		return errors.New("chart " + path + ": no series")
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Add(plotter.NewGrid())
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = logTicks{}
	}
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	}
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.TextStyle.Font.Size = vg.Points(9)
	for i, s := range c.Series {
		if len(s.X) != len(s.Y) || len(s.X) == 0 {
			return fmt.Errorf("chart %s: series %q has %d x and %d y values", path, s.Label, len(s.X), len(s.Y))
		}
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			if (c.LogX && s.X[j] <= 0) || (c.LogY && s.Y[j] <= 0) {
				return fmt.Errorf("chart %s: series %q has a point (%g, %g) off a log axis", path, s.Label, s.X[j], s.Y[j])
			}
			xys[j].X, xys[j].Y = s.X[j], s.Y[j]
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("chart %s: %w", path, err)
		}
		l.Color = palette[i%len(palette)]
		l.Dashes = plotutil.Dashes(i / len(palette))
		l.Width = vg.Points(1.5)
		p.Add(l)
		thumbs := []plot.Thumbnailer{l}
		if c.Points {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("chart %s: %w", path, err)
			}
			sc.Color = l.Color
			sc.Shape = plotutil.Shape(i)
			p.Add(sc)
			thumbs = append(thumbs, sc)
		}
		leg.Add(s.Label, thumbs...)
	}
	const plotW, plotH = 16 * vg.Centimeter, 10 * vg.Centimeter
	legW := vg.Length(0)
	for _, s := range c.Series {
		legW = max(legW, leg.TextStyle.Width(" "+s.Label))
	}
	legW += leg.ThumbnailWidth + vg.Points(12)
	img := vgimg.New(plotW+legW, plotH)
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, 0, -legW, 0, 0))
	// The legend starts level with the top of the data area, below the title.
	top := -p.Title.TextStyle.Height(p.Title.Text) - p.Title.Padding - vg.Points(4)
	leg.Draw(draw.Crop(dc, plotW+vg.Points(6), 0, 0, top))
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	_, werr := vgimg.PngCanvas{Canvas: img}.WriteTo(fh)
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("chart %s: %w", path, werr)
	}
	return nil
}

// logTicks marks a log axis so that it is readable over any range: every power of ten is
// labelled; over fewer than three decades 2× and 5× are too, and over less than one decade
// every 1..9 × 10^k. The unlabelled 1..9 × 10^k are minor ticks.
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: formatTick(lo)}}
	}
	decades := math.Log10(hi / lo)
	labelled := func(m int) bool {
		switch {
		case decades < 1:
			return true
		case decades < 3:
			return m == 1 || m == 2 || m == 5
		}
		return m == 1
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for m := 1; m <= 9; m++ {
			v := float64(m) * base
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if labelled(m) {
				t.Label = formatTick(v)
			}
			ticks = append(ticks, t)
		}
	}
	n := 0
	for _, t := range ticks {
		if t.Label != "" {
			n++
		}
	}
	if n < 2 { // a narrow range between ticks: label its ends
		ticks = append(ticks, plot.Tick{Value: lo, Label: formatTick(lo)}, plot.Tick{Value: hi, Label: formatTick(hi)})
	}
	return ticks
}

// formatTick prints a tick value with at most three significant digits and no exponent in the
// common range.
func formatTick(v float64) string {
	if v >= 1e-3 && v < 1e7 {
		return strconv.FormatFloat(float64(float32(v)), 'f', -1, 32)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// TTFTCDF returns the chart of the TTFT distribution of each row (rows without data are left out).
func TTFTCDF(title string, rows []Summary) Chart {
	c := Chart{Title: title, XLabel: "TTFT (ms, log scale)", YLabel: "share of requests", LogX: true}
	for _, r := range rows {
		if len(r.TTFTQuantiles) == 0 {
			continue
		}
		s := Series{Label: r.Label}
		for i, v := range r.TTFTQuantiles {
			s.X = append(s.X, max(v, 0.001))
			s.Y = append(s.Y, float64(i)/float64(len(r.TTFTQuantiles)-1))
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// ByGateways groups rows by label into series of metric against the number of gateways; label
// strips the gateway count from a row's label.
func ByGateways(rows []Summary, label func(Summary) string, metric func(Summary) float64) []Series {
	var out []Series
	idx := map[string]int{}
	for _, r := range rows {
		l := label(r)
		i, ok := idx[l]
		if !ok {
			i = len(out)
			idx[l] = i
			out = append(out, Series{Label: l})
		}
		out[i].X = append(out[i].X, float64(r.Gateways))
		out[i].Y = append(out[i].Y, metric(r))
	}
	return out
}
