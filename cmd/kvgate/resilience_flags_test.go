package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// TestResilienceFlags checks the health, breaker and retry knobs: their DESIGN §3 defaults, each
// as a flag, and each as a config key.
func TestResilienceFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kvgate.yaml")
	os.WriteFile(cfg, []byte("health_check_path: /ready\nhealth_check_interval: 2s\nhealth_failure_threshold: 4\ncb_half_open_probes: 2\nretry_max_attempts: 3\n"), 0o644)
	cases := []parseCase{
		{name: "defaults", check: func(t *testing.T, o *serveOptions) {
			h, b, r := o.gw.Health, o.gw.Breaker, o.gw.Proxy.Retry
			if h != worker.DefaultHealthConfig() {
				t.Errorf("health %+v", h)
			}
			if b.FailureThreshold != 10 || b.SuccessThreshold != 3 || b.OpenTimeout != time.Minute || b.HalfOpenProbes != 1 || b.Disabled {
				t.Errorf("breaker %+v", b)
			}
			if r.MaxAttempts != 5 || r.InitialBackoff != 50*time.Millisecond || r.Multiplier != 1.5 || r.MaxBackoff != 30*time.Second || r.Jitter != 0.2 {
				t.Errorf("retry %+v", r)
			}
			if o.shutdownGrace != 30*time.Second {
				t.Errorf("grace %v", o.shutdownGrace)
			}
		}},
		{name: "flags", args: []string{"--health-check-path", "/live", "--health-check-interval", "1s", "--health-check-timeout", "300ms",
			"--health-success-threshold", "1", "--health-failure-threshold", "5", "--disable-health-check",
			"--cb-failure-threshold", "4", "--cb-timeout", "5s", "--cb-half-open-probes", "3", "--shutdown-grace-period", "7s"},
			check: func(t *testing.T, o *serveOptions) {
				want := worker.HealthConfig{Path: "/live", Interval: time.Second, Timeout: 300 * time.Millisecond, SuccessThreshold: 1, FailureThreshold: 5, Disabled: true}
				if o.gw.Health != want {
					t.Errorf("health %+v, want %+v", o.gw.Health, want)
				}
				if b := o.gw.Breaker; b.FailureThreshold != 4 || b.OpenTimeout != 5*time.Second || b.HalfOpenProbes != 3 {
					t.Errorf("breaker %+v", b)
				}
				if o.shutdownGrace != 7*time.Second {
					t.Errorf("grace %v", o.shutdownGrace)
				}
			}},
		{name: "config keys", args: []string{"--config", cfg}, check: func(t *testing.T, o *serveOptions) {
			h := o.gw.Health
			if h.Path != "/ready" || h.Interval != 2*time.Second || h.FailureThreshold != 4 || o.gw.Breaker.HalfOpenProbes != 2 || o.gw.Proxy.Retry.MaxAttempts != 3 {
				t.Errorf("health %+v, probes %d, attempts %d", h, o.gw.Breaker.HalfOpenProbes, o.gw.Proxy.Retry.MaxAttempts)
			}
		}},
		{name: "relative health path", args: []string{"--health-check-path", "health"}, wantErr: "must start with /"},
		{name: "failure rate", args: []string{"--cb-failure-rate-threshold", "0.4", "--cb-failure-rate-window", "30"}, check: func(t *testing.T, o *serveOptions) {
			if b := o.gw.Breaker; b.FailureRateThreshold != 0.4 || b.FailureRateWindow != 30 {
				t.Errorf("breaker %+v", b)
			}
		}},
		{name: "failure rate out of range", args: []string{"--cb-failure-rate-threshold", "1.5"}, wantErr: "failure rate threshold"},
	}
	runParseCases(t, cases)
}

// TestWorkerLabelFlag checks per-worker overrides for workers given by flag.
func TestWorkerLabelFlag(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		want    map[string]map[string]string // URL → labels
	}{
		{name: "two overrides on one worker", args: []string{"--worker-urls", "http://a:1,http://b:2",
			"--worker-label", "cb_timeout=10s@http://a:1/", "--worker-label", "health_check_path=/ping@http://a:1"},
			want: map[string]map[string]string{"http://a:1": {"cb_timeout": "10s", "health_check_path": "/ping"}, "http://b:2": nil}},
		{name: "kept with the policy label", args: []string{"--decode", "http://d:1", "--decode-policy", "random", "--worker-label", "cb_failure_threshold=2@http://d:1"},
			want: map[string]map[string]string{"http://d:1": {"policy": "random", "cb_failure_threshold": "2"}}},
		{name: "unknown worker", args: []string{"--worker-urls", "http://a:1", "--worker-label", "cb_timeout=1s@http://z:9"}, wantErr: "not a configured worker"},
		{name: "no url", args: []string{"--worker-urls", "http://a:1", "--worker-label", "cb_timeout=1s"}, wantErr: "KEY=VALUE@URL"},
		{name: "bad value", args: []string{"--worker-urls", "http://a:1", "--worker-label", "cb_timeout=soon@http://a:1"}, wantErr: "cb_timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseServe(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			regs, err := registrations(o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range regs {
				want, ok := tc.want[a.URL]
				if !ok {
					t.Fatalf("unexpected worker %s", a.URL)
				}
				if len(want) != len(a.Labels) {
					t.Errorf("%s: labels %v, want %v", a.URL, a.Labels, want)
				}
				for k, v := range want {
					if a.Labels[k] != v {
						t.Errorf("%s: labels %v, want %v", a.URL, a.Labels, want)
					}
				}
			}
		})
	}
}
