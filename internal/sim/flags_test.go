package sim

import (
	"flag"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		check  func(t *testing.T, cfg Config, faults Faults, faulty []int)
		errors bool
	}{
		{"defaults", nil, func(t *testing.T, cfg Config, faults Faults, faulty []int) {
			e := cfg.Engine
			if e.BlockSize != 16 || e.KVTokens != 524288 || e.MaxRunning != 256 || e.PrefillChunk != 2048 ||
				e.PrefillTPS != 8000 || e.DecodeBase != 6*time.Millisecond || e.DecodePerReq != 350*time.Microsecond {
				t.Errorf("engine = %+v", e)
			}
			if cfg.Model != DefaultModel || cfg.Flavor != FlavorSGLang || faults != (Faults{ErrorStatus: 503}) {
				t.Errorf("cfg = %+v, faults = %+v", cfg, faults)
			}
			if !reflect.DeepEqual(faulty, []int{0, 1, 2}) {
				t.Errorf("faulty = %v", faulty)
			}
		}, false},
		{"knobs", []string{"--flavor", "vllm", "--decode-base-ms", "2.5", "--decode-per-req-ms", "0.1",
			"--fault-hang", "--fault-engines", "2, 0,2", "--fault-slow-start", "3s"},
			func(t *testing.T, cfg Config, faults Faults, faulty []int) {
				if cfg.Flavor != FlavorVLLM || cfg.Engine.DecodeBase != 2500*time.Microsecond || cfg.Engine.DecodePerReq != 100*time.Microsecond {
					t.Errorf("cfg = %+v", cfg)
				}
				if !faults.Hang || faults.SlowStart != 3*time.Second || cfg.Faults != (Faults{}) {
					t.Errorf("faults = %+v, cfg faults = %+v", faults, cfg.Faults)
				}
				if !reflect.DeepEqual(faulty, []int{0, 2}) {
					t.Errorf("faulty = %v", faulty)
				}
			}, false},
		{"per-slot timing", []string{"--engine-timing", "per-slot", "--prefill-overhead", "20ms", "--load-factor", "2.5"},
			func(t *testing.T, cfg Config, faults Faults, faulty []int) {
				e := cfg.Engine
				if e.Timing != engine.TimingPerSlot || e.PrefillOverhead != 20*time.Millisecond || e.LoadFactor != 2.5 {
					t.Errorf("engine = %+v", e)
				}
			}, false},
		{"bad timing", []string{"--engine-timing", "chunked"}, nil, true},
		{"bad load factor", []string{"--engine-timing", "per-slot", "--load-factor", "0.5"}, nil, true},
		{"bad flavor", []string{"--flavor", "tgi"}, nil, true},
		{"bad engine index", []string{"--fault-engines", "3"}, nil, true},
		{"bad error rate", []string{"--fault-error-rate", "1.5"}, nil, true},
		{"negative decode", []string{"--decode-base-ms", "-1"}, nil, true},
		{"zero count", []string{"--count", "0"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("sim", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := RegisterFlags(fs)
			if err := fs.Parse(append([]string{"--count", "3"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			cfg, faults, faulty, err := f.Config()
			if (err != nil) != tc.errors {
				t.Fatalf("err = %v, want error %v", err, tc.errors)
			}
			if tc.check != nil {
				tc.check(t, cfg, faults, faulty)
			}
		})
	}
}
