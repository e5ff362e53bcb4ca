package bench

import (
	"errors"
	"fmt"
	"time"
)

// SweepConfig configures a goodput search: the highest open-loop rate at which a configuration
// still meets a TTFT p99 SLO.
type SweepConfig struct {
	// SLO is the TTFT p99 bound. Required.
	SLO time.Duration
	// MaxErrorRate is the share of failed requests a passing rate may have. Zero means none.
	MaxErrorRate float64
	// Lo is the first rate tried (sessions/s); Hi caps the search. Lo > 0, Hi >= Lo.
	Lo, Hi float64
	// Steps is the number of bisection steps after the doubling phase. Zero means 6.
	Steps int
}

// Validate checks c.
func (c SweepConfig) Validate() error {
	switch {
	case c.SLO <= 0:
		return errors.New("sweep: the TTFT p99 SLO must be > 0")
	case c.Lo <= 0 || c.Hi < c.Lo:
		return fmt.Errorf("sweep: need 0 < lo <= hi, got lo %g hi %g", c.Lo, c.Hi)
	case c.MaxErrorRate < 0 || c.MaxErrorRate >= 1:
		return fmt.Errorf("sweep: max error rate %g must be in [0,1)", c.MaxErrorRate)
	case c.Steps < 0:
		return fmt.Errorf("sweep: steps %d must be >= 0", c.Steps)
	}
	return nil
}

// SweepPoint is one probed rate.
type SweepPoint struct {
	// Rate is the offered open-loop rate.
	Rate float64 `json:"rate"`
	// TTFTP99, HitRate and Errors are what the run at Rate measured.
	TTFTP99 float64 `json:"ttft_p99_ms"`
	HitRate float64 `json:"hit_rate"`
	Errors  int     `json:"errors"`
	// Pass reports whether the run met the SLO.
	Pass bool `json:"pass"`
}

// SweepResult is the outcome of a goodput search for one configuration.
type SweepResult struct {
	// Label names the configuration.
	Label string `json:"label"`
	// SLOms is the TTFT p99 objective in milliseconds.
	SLOms float64 `json:"slo_ttft_p99_ms"`
	// Goodput is the highest probed rate that met the SLO; zero when even Lo failed.
	Goodput float64 `json:"goodput_rate"`
	// HitRate is the hit rate measured at Goodput.
	HitRate float64 `json:"hit_rate_at_goodput"`
	// GoodputVsOracle is Goodput as a fraction of the oracle's in the same grid; 0 without one.
	GoodputVsOracle float64 `json:"goodput_vs_oracle,omitempty"`
	// Points are the probes, in the order they ran.
	Points []SweepPoint `json:"points"`
}

// Sweep searches for the goodput of one configuration: it doubles the rate from Lo until the SLO
// fails (or Hi is reached), then bisects between the last pass and the first failure. run measures
// one rate. The probes are a deterministic function of the results, so a deterministic run gives
// a deterministic sweep.
func Sweep(label string, c SweepConfig, run func(rate float64) (Summary, error)) (SweepResult, error) {
	if err := c.Validate(); err != nil {
		return SweepResult{}, err
	}
	steps := c.Steps
	if steps == 0 {
		steps = 6
	}
	res := SweepResult{Label: label, SLOms: ms(c.SLO)}
	probe := func(rate float64) (bool, error) {
		s, err := run(rate)
		if err != nil {
			return false, fmt.Errorf("sweep %s at rate %g: %w", label, rate, err)
		}
		n := s.OK + s.Errors
		pass := s.OK > 0 && s.TTFTP99 <= ms(c.SLO) && float64(s.Errors) <= c.MaxErrorRate*float64(n)
		res.Points = append(res.Points, SweepPoint{Rate: round(rate, 4), TTFTP99: s.TTFTP99, HitRate: s.HitRate, Errors: s.Errors, Pass: pass})
		if pass && rate > res.Goodput {
			res.Goodput, res.HitRate = round(rate, 4), s.HitRate
		}
		return pass, nil
	}
	lo, hi := 0.0, 0.0 // last pass, first failure
	for rate := c.Lo; ; rate = min(rate*2, c.Hi) {
		pass, err := probe(rate)
		if err != nil {
			return res, err
		}
		if !pass {
			hi = rate
			break
		}
		lo = rate
		if rate >= c.Hi {
			return res, nil
		}
	}
	if lo == 0 {
		return res, nil
	}
	for i := 0; i < steps; i++ {
		mid := (lo + hi) / 2
		pass, err := probe(mid)
		if err != nil {
			return res, err
		}
		if pass {
			lo = mid
		} else {
			hi = mid
		}
	}
	return res, nil
}
