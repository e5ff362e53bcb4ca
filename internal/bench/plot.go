package bench

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
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
	// Series are the lines, drawn in order with distinct colours.
	Series []Series
}

// SavePNG renders c to path (which must end in .png), 16 × 10 cm.
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
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = true
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
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Label, l)
		if c.Points {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("chart %s: %w", path, err)
			}
			sc.Color = plotutil.Color(i)
			sc.Shape = plotutil.Shape(i)
			p.Add(sc)
		}
	}
	if err := p.Save(16*vg.Centimeter, 10*vg.Centimeter, path); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
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
