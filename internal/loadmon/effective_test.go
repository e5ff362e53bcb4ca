package loadmon

import (
	"math"
	"testing"
	"time"
)

func TestEffective(t *testing.T) {
	// The worker reported 10 running + 5 waiting when this gateway had 2 in flight to it.
	r := Report{Running: 10, Waiting: 5, InflightAtPoll: 2}
	tests := []struct {
		name  string
		mode  Mode
		local int64
		r     Report
		fresh bool
		want  int64
	}{
		{"stale falls back to local", ModeEffective, 3, r, false, 3},
		{"stale snapshot mode falls back to local", ModeSnapshot, 3, r, false, 3},
		{"stale max mode falls back to local", ModeMax, 3, r, false, 3},
		{"no change since poll is the backlog", ModeEffective, 2, r, true, 15},
		{"sent 4 since poll adds them", ModeEffective, 6, r, true, 19},
		{"2 finished since poll subtract", ModeEffective, 0, r, true, 13},
		{"never below local", ModeEffective, 40, Report{InflightAtPoll: 39}, true, 40},
		{"local mode ignores the report", ModeLocal, 3, r, true, 3},
		{"snapshot mode is the backlog", ModeSnapshot, 6, r, true, 15},
		{"max mode", ModeMax, 6, r, true, 15},
		{"max mode local wins", ModeMax, 20, r, true, 20},
		{"backlog sums in int64 beyond int32", ModeEffective, 0, Report{Running: math.MaxInt32, Waiting: math.MaxInt32}, true, 2 * math.MaxInt32},
		{"backlog saturates", ModeEffective, 1, Report{Running: math.MaxInt64, Waiting: math.MaxInt64}, true, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Effective(tt.mode, tt.local, tt.r, tt.fresh); got != tt.want {
				t.Fatalf("Effective(%v, %d, %+v, %v) = %d, want %d", tt.mode, tt.local, tt.r, tt.fresh, got, tt.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"", ModeEffective, false},
		{"effective", ModeEffective, false},
		{" Local ", ModeLocal, false},
		{"snapshot", ModeSnapshot, false},
		{"MAX", ModeMax, false},
		{"min", ModeEffective, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseMode(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseMode(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err == nil && tt.in != "" {
				if back, _ := ParseMode(got.String()); back != got {
					t.Fatalf("String round trip: %v -> %q -> %v", got, got.String(), back)
				}
			}
		})
	}
}

func TestConfig(t *testing.T) {
	t.Run("defaults resolve", func(t *testing.T) {
		c := DefaultConfig()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		r := c.withDefaults()
		if r.Interval != time.Second || r.Timeout != 500*time.Millisecond || r.StaleAfter != 3*time.Second ||
			r.MaxBody != 4<<20 || r.Concurrency != 64 || r.Mode != ModeScaled || r.Transport == nil || r.Now == nil || r.Logger == nil {
			t.Fatalf("resolved defaults = %+v", r)
		}
	})
	t.Run("derived from a short interval", func(t *testing.T) {
		r := Config{Interval: 200 * time.Millisecond}.withDefaults()
		if r.Timeout != 100*time.Millisecond || r.StaleAfter != 600*time.Millisecond {
			t.Fatalf("timeout %v stale %v, want 100ms 600ms", r.Timeout, r.StaleAfter)
		}
	})
	bad := []struct {
		name string
		c    Config
	}{
		{"negative interval", Config{Interval: -time.Second}},
		{"timeout over interval", Config{Interval: time.Second, Timeout: 2 * time.Second}},
		{"stale under interval", Config{Interval: time.Second, StaleAfter: time.Millisecond}},
		{"unknown mode", Config{Mode: ModeScaled + 1}},
		{"negative body", Config{MaxBody: -1}},
		{"negative concurrency", Config{Concurrency: -1}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.c.Validate(); err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error", tt.c)
			}
		})
	}
}

func TestScaledModeAndReplicaEstimate(t *testing.T) {
	r := Report{Running: 30, Waiting: 10, InflightAtPoll: 10, Replicas: 4}
	cases := []struct {
		name  string
		local int64
		r     Report
		want  int64
	}{
		{"no change since poll", 10, r, 40},
		{"two sent since poll count for four replicas", 12, r, 48},
		{"one finished since poll", 9, r, 36},
		{"never below local", 45, Report{Running: 1, InflightAtPoll: 44, Replicas: 4}, 45},
		{"unknown replicas act as one", 12, Report{Running: 40, InflightAtPoll: 10}, 42},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Effective(ModeScaled, tc.local, tc.r, true); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
	if got := Effective(ModeScaled, 7, r, false); got != 7 {
		t.Errorf("stale report: %d, want local 7", got)
	}
	for _, tc := range []struct {
		backlog, local int64
		want           float64
	}{{0, 0, 1}, {79, 19, 4}, {5, 20, 1}, {1 << 40, 0, MaxReplicas}, {-1, 3, 1}} {
		if got := EstimateReplicas(tc.backlog, tc.local); got != tc.want {
			t.Errorf("EstimateReplicas(%d, %d) = %v, want %v", tc.backlog, tc.local, got, tc.want)
		}
	}
	if m, err := ParseMode("scaled"); err != nil || m != ModeScaled {
		t.Errorf("ParseMode(scaled) = %v, %v", m, err)
	}
}

func TestSetReplicasStampsTheRound(t *testing.T) {
	entries := map[string]Entry{
		"a": {Report: Report{Running: 30, Waiting: 9, InflightAtPoll: 9}},
		"b": {Report: Report{Running: 40, InflightAtPoll: 10}},
	}
	setReplicas(entries)
	for id, e := range entries {
		if e.Report.Replicas != 4 {
			t.Errorf("%s: replicas %v, want (79+1)/(19+1) = 4", id, e.Report.Replicas)
		}
	}
}
