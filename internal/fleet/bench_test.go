package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
)

// BenchmarkSimulate measures the simulator's cost per simulated request: 16 engines, shared-prefix
// near their saturation, for round_robin (engine and simulator cost only) and cache_aware_hash
// (plus the prefix tree).
func BenchmarkSimulate(b *testing.B) {
	for _, pol := range []string{"round_robin", "cache_aware_hash"} {
		b.Run(pol, func(b *testing.B) {
			requests := 0
			for b.Loop() {
				sched, err := bench.NewSchedule(bench.NewSharedPrefix(1), bench.Arrivals{Rate: 500}, bench.Limits{Duration: 20 * time.Second}, 1)
				if err != nil {
					b.Fatal(err)
				}
				s, err := Run(context.Background(), Config{Engines: 16, Policy: pol}, sched)
				if err != nil {
					b.Fatal(err)
				}
				requests += s.OK
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(requests), "ns/request")
		})
	}
}
