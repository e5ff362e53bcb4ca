package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/loadmon"
)

func TestGridSpec(t *testing.T) {
	w := bench.NewMultiTurn(1)
	arr, lim := bench.Arrivals{Rate: 2}, bench.Limits{Duration: 10 * time.Second}
	g := GridSpec{Base: Config{Engines: 8}, Policies: "round_robin, oracle", Gateways: "1,2", LoadModes: "scaled",
		Splits: "even,80/20", EngineMix: "6x1,2x0.5", Timing: "per-slot", Spread: "session"}
	x, err := g.Build(w, arr, lim, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Configs()) != 6 || x.Base.Engines != 0 || len(x.Base.EngineMix) != 2 || x.Base.Spread != SpreadSession ||
		x.Modes[0] != loadmon.ModeScaled || x.Seed != 7 || x.Base.Seed != 7 {
		t.Fatalf("experiment %+v with %d runs", x, len(x.Configs()))
	}
	if title := x.Title(); !strings.Contains(title, "engines 6x1,2x0.5 (per-slot timing)") || !strings.Contains(title, "spread session, seed 7") {
		t.Errorf("title %q", title)
	}
	for field, bad := range map[string]GridSpec{
		"policies":       {Base: Config{Engines: 1}, Policies: "fastest", Gateways: "1", LoadModes: "scaled"},
		"gateways":       {Base: Config{Engines: 1}, Policies: "random", Gateways: "0", LoadModes: "scaled"},
		"load modes":     {Base: Config{Engines: 1}, Policies: "random", Gateways: "1", LoadModes: "psychic"},
		"gateway splits": {Base: Config{Engines: 1}, Policies: "random", Gateways: "1", LoadModes: "scaled", Splits: "1/x"},
		"engine mix":     {Base: Config{Engines: 1}, Policies: "random", Gateways: "1", LoadModes: "scaled", EngineMix: "8"},
		"engine timing":  {Base: Config{Engines: 1}, Policies: "random", Gateways: "1", LoadModes: "scaled", Timing: "x"},
		"engines":        {Policies: "random", Gateways: "1", LoadModes: "scaled"},
		"at least one":   {Base: Config{Engines: 1}, Policies: " , ", Gateways: "1", LoadModes: "scaled"},
	} {
		if _, err := bad.Build(w, arr, lim, 1); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v", field, err)
		}
	}
}
