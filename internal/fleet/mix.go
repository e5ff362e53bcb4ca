package fleet

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

// EngineClass is one kind of engine in a heterogeneous fleet: Count engines whose compute speed
// (prefill rate, prefill overhead and decode step costs) is Speed times the base engine's and whose KV cache is KV
// times its size.
type EngineClass struct {
	Count int
	Speed float64
	KV    float64
}

// ParseEngineMix parses a mix written as comma-separated COUNTxSPEED[:KV] classes, for example
// "6x1,2x0.5" (a quarter of eight engines half as fast) or "4x1,4x1:0.5" (half with half the
// cache). Engines are numbered in the order the classes are written.
func ParseEngineMix(s string) ([]EngineClass, error) {
	var out []EngineClass
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		cnt, rest, ok := strings.Cut(f, "x")
		if !ok {
			return nil, fmt.Errorf("engine mix %q: want COUNTxSPEED[:KV]", f)
		}
		c := EngineClass{KV: 1}
		var err error
		if c.Count, err = strconv.Atoi(cnt); err != nil || c.Count < 1 || c.Count > 4096 {
			return nil, fmt.Errorf("engine mix %q: count must be in [1, 4096]", f)
		}
		speed, kv, hasKV := strings.Cut(rest, ":")
		if c.Speed, err = strconv.ParseFloat(speed, 64); err != nil || !(c.Speed >= 0.01 && c.Speed <= 100) {
			return nil, fmt.Errorf("engine mix %q: speed must be in [0.01, 100]", f)
		}
		if hasKV {
			if c.KV, err = strconv.ParseFloat(kv, 64); err != nil || !(c.KV >= 0.01 && c.KV <= 100) {
				return nil, fmt.Errorf("engine mix %q: kv factor must be in [0.01, 100]", f)
			}
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("engine mix %q names no engines", s)
	}
	return out, nil
}

// mixCount returns the number of engines a mix describes.
func mixCount(mix []EngineClass) int {
	n := 0
	for _, c := range mix {
		n += c.Count
	}
	return n
}

// engineConfig returns the configuration of engine i: cfg.Engine, scaled by its class of
// cfg.EngineMix when there is one.
func (c Config) engineConfig(i int) engine.Config {
	e := c.Engine
	for _, cl := range c.EngineMix {
		if i >= cl.Count {
			i -= cl.Count
			continue
		}
		e = e.WithDefaults() // scale the costs the engine would use, not zero
		e.PrefillTPS *= cl.Speed
		e.DecodeBase = time.Duration(float64(e.DecodeBase) / cl.Speed)
		e.DecodePerReq = time.Duration(float64(e.DecodePerReq) / cl.Speed)
		e.PrefillOverhead = time.Duration(float64(e.PrefillOverhead) / cl.Speed)
		e.KVTokens = int(float64(e.KVTokens) * cl.KV)
		return e
	}
	return e
}
