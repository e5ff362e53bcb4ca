// Package drills holds kvgate's fault drills: tests that run the real gateway (registry, health
// checker, circuit breakers, retrying proxy) between simulated engines (package sim) on loopback
// ports, inject faults — a worker killed, hung, erroring, flapping, the whole fleet down, a
// client leaving mid-stream — and assert what clients see. Each drill also checks that nothing is
// left in flight and no goroutine leaked, and measures how long the gateway took to shed the
// faulty worker and to take it back.
//
// Run them with `go test -race -count=1 -v ./internal/drills/`; the drill table is printed at the
// end and written to the file named by KVGATE_DRILL_REPORT when it is set. docs/reliability.md
// records a run. The package has no non-test code.
package drills
