package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/loadmon"
)

// runSync runs the default policy on a long-context fleet (tenants whose contexts fit the
// fleet's caches once, not once per replica) with the given gateways and sync model.
func runSync(t *testing.T, gateways int, m SyncModel) bench.Summary {
	t.Helper()
	cfg := Config{Engines: 4, Gateways: gateways, Policy: "cache_aware_hash", LoadMode: loadmon.ModeScaled, Seed: 1, Sync: m}
	sum, err := Run(context.Background(), cfg, mustSchedule(t, bench.NewLongContext(1), bench.Arrivals{Rate: 6},
		bench.Limits{Duration: 40 * time.Second, Warmup: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestReplicaSyncKeepsTheCache: 2 replicas that share their decisions keep most of the hit rate
// of one replica, which without sharing they lose, and its tail; a bus lost mid-run fails open
// (no request fails).
func TestReplicaSyncKeepsTheCache(t *testing.T) {
	one := runSync(t, 1, SyncModel{})
	off := runSync(t, 2, SyncModel{})
	on := runSync(t, 2, SyncModel{Enabled: true, Delay: time.Millisecond})
	lost := runSync(t, 2, SyncModel{Enabled: true, Delay: time.Millisecond, LostAt: 25 * time.Second})
	t.Logf("hit: 1 replica %.3f, 2 without sync %.3f, with %.3f, bus lost at 25s %.3f", one.HitRate, off.HitRate, on.HitRate, lost.HitRate)
	t.Logf("p99: 1 replica %.0f ms, 2 without sync %.0f, with %.0f, bus lost %.0f", one.TTFTP99, off.TTFTP99, on.TTFTP99, lost.TTFTP99)
	if on.HitRate < off.HitRate+0.5*(one.HitRate-off.HitRate) {
		t.Errorf("2 synced replicas hit %.3f: want at least half the way from %.3f (without sync) to one replica's %.3f",
			on.HitRate, off.HitRate, one.HitRate)
	}
	if on.TTFTP99 > 1.15*one.TTFTP99 || off.TTFTP99 < 1.3*one.TTFTP99 {
		t.Errorf("p99 %.0f ms with sync, %.0f without: want ≤ 1.15 × and > 1.3 × one replica's %.0f",
			on.TTFTP99, off.TTFTP99, one.TTFTP99)
	}
	if lost.Errors != 0 || on.Errors != 0 {
		t.Errorf("failed requests: %d with sync, %d with the bus lost", on.Errors, lost.Errors)
	}
	if on.Label != "cache_aware_hash/scaled+sync(1ms)" && on.Label == off.Label {
		t.Errorf("the synced row is not labelled: %q", on.Label)
	}
}
