package main

import "testing"

// TestMemoryLimit checks the soft limit derived from the body budget: budget plus headroom, never
// below the floor, none when GOMEMLIMIT is set or no bound is asked for.
func TestMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		budget, headroom int64
		env              string
		want             int64
	}{
		{512 << 20, 64 << 20, "", 576 << 20},
		{1 << 30, DefaultMemoryHeadroomBytes, "", 1<<30 + 64<<20},
		{8 << 20, 8 << 20, "", minMemoryLimitBytes},
		{512 << 20, 64 << 20, "2GiB", -1},
		{-1, 64 << 20, "", -1},
		{512 << 20, -1, "", -1},
		{1 << 62, 1 << 62, "", -1},
	} {
		if got := memoryLimit(c.budget, c.headroom, c.env); got != c.want {
			t.Errorf("memoryLimit(%d, %d, %q) = %d, want %d", c.budget, c.headroom, c.env, got, c.want)
		}
	}
}
