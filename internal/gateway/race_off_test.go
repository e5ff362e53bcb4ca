//go:build !race

package gateway

// raceEnabled: the race detector is on, and allocations are larger than without it.
const raceEnabled = false
