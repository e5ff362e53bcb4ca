package policy

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/internal/worker"
)

// BenchmarkRouterFor measures the policy lookup every request makes, from many goroutines at
// once (run it with -cpu 2 to see contention between the two cores of a CI box).
//
//	go test -run XXX -bench RouterFor -cpu 1,2 ./internal/policy/
func BenchmarkRouterFor(b *testing.B) {
	cfg := DefaultConfig()
	cfg.NoBackground = true
	r, err := NewRouter("round_robin", cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	models := make([]string, 16)
	for i := range models {
		models[i] = fmt.Sprintf("model-%d", i)
		if _, err := r.For(models[i], worker.Regular); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if p, _ := r.For(models[i&15], worker.Regular); p == nil {
				b.Fatal("no policy")
			}
			i++
		}
	})
}
