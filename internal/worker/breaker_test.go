package worker

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// op is one step of a breaker script: "ok" and "fail" run a request to its end, "cancel" ends one
// as the client leaving, "wait" advances the clock by the open timeout.
type op string

func runOps(t *testing.T, b *Breaker, clk *testutil.Clock, ops []op) {
	t.Helper()
	for i, o := range ops {
		if o == "wait" {
			clk.Advance(b.cfg.OpenTimeout)
			continue
		}
		done, abandon, ok := b.Begin(clk.Now())
		if !ok {
			t.Fatalf("op %d (%s): not admitted in state %s", i, o, b.State(clk.Now()))
		}
		switch o {
		case "ok":
			done(true)
		case "fail":
			done(false)
		case "cancel":
			abandon()
		}
	}
}

func TestBreakerTransitions(t *testing.T) {
	cfg := BreakerConfig{FailureThreshold: 3, SuccessThreshold: 2, OpenTimeout: time.Minute}
	rep := func(o op, n int) []op {
		out := make([]op, n)
		for i := range out {
			out[i] = o
		}
		return out
	}
	cat := func(parts ...[]op) []op {
		var out []op
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name        string
		ops         []op
		want        CircuitState
		transitions string
	}{
		{name: "successes keep it closed", ops: rep("ok", 20), want: Closed},
		{name: "failures below the threshold", ops: rep("fail", 2), want: Closed},
		{name: "a success resets the count", ops: cat(rep("fail", 2), []op{"ok"}, rep("fail", 2)), want: Closed},
		{name: "consecutive failures open", ops: rep("fail", 3), want: Open, transitions: "closed>open"},
		{name: "client cancels never count", ops: cat(rep("fail", 2), rep("cancel", 10), []op{"fail"}), want: Open, transitions: "closed>open"},
		{name: "only cancels", ops: rep("cancel", 50), want: Closed},
		{name: "half-open after the timeout", ops: cat(rep("fail", 3), []op{"wait"}), want: HalfOpen, transitions: "closed>open"},
		{name: "probe success below threshold", ops: cat(rep("fail", 3), []op{"wait", "ok"}), want: HalfOpen, transitions: "closed>open open>half_open"},
		{name: "probe successes close", ops: cat(rep("fail", 3), []op{"wait", "ok", "ok"}), want: Closed, transitions: "closed>open open>half_open half_open>closed"},
		{name: "probe failure reopens", ops: cat(rep("fail", 3), []op{"wait", "ok", "fail"}), want: Open, transitions: "closed>open open>half_open half_open>open"},
		{name: "cancelled probe decides nothing", ops: cat(rep("fail", 3), []op{"wait", "cancel", "ok", "ok"}), want: Closed, transitions: "closed>open open>half_open half_open>closed"},
		{name: "reopened waits a new timeout", ops: cat(rep("fail", 3), []op{"wait", "fail", "wait", "ok", "ok"}), want: Closed,
			transitions: "closed>open open>half_open half_open>open open>half_open half_open>closed"},
		{name: "closed again counts afresh", ops: cat(rep("fail", 3), []op{"wait", "ok", "ok"}, rep("fail", 2)), want: Closed,
			transitions: "closed>open open>half_open half_open>closed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := testutil.NewClock(time.Unix(1e9, 0))
			c := cfg
			c.Clock = clk.Now
			b := NewBreaker(c)
			var got []string
			b.OnChange(func(from, to CircuitState) { got = append(got, from.String()+">"+to.String()) })
			runOps(t, b, clk, tc.ops)
			if s := b.State(clk.Now()); s != tc.want {
				t.Errorf("state %s, want %s", s, tc.want)
			}
			if g := strings.Join(got, " "); g != tc.transitions {
				t.Errorf("transitions %q, want %q", g, tc.transitions)
			}
		})
	}
}

// TestBreakerOpenRefuses checks an open circuit admits nothing and Allows agrees.
func TestBreakerOpenRefuses(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1e9, 0))
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, OpenTimeout: time.Minute, Clock: clk.Now})
	runOps(t, b, clk, []op{"fail"})
	if b.Allows(clk.Now()) {
		t.Error("an open circuit allows")
	}
	if _, _, ok := b.Begin(clk.Now()); ok {
		t.Error("an open circuit admitted a request")
	}
	clk.Advance(time.Minute - time.Nanosecond)
	if _, _, ok := b.Begin(clk.Now()); ok {
		t.Error("admitted before the open timeout")
	}
}

// TestBreakerHalfOpenProbeLimit admits exactly HalfOpenProbes requests at once while half-open,
// and a slot frees when a probe ends.
func TestBreakerHalfOpenProbeLimit(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1e9, 0))
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, SuccessThreshold: 5, HalfOpenProbes: 2, OpenTimeout: time.Second, Clock: clk.Now})
	runOps(t, b, clk, []op{"fail", "wait"})
	d1, _, ok1 := b.Begin(clk.Now())
	_, a2, ok2 := b.Begin(clk.Now())
	_, _, ok3 := b.Begin(clk.Now())
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("admitted %v %v %v, want true true false", ok1, ok2, ok3)
	}
	if b.Allows(clk.Now()) {
		t.Error("Allows with every probe slot taken")
	}
	d1(true)
	if _, _, ok := b.Begin(clk.Now()); !ok {
		t.Error("a finished probe did not free its slot")
	}
	a2()
	a2() // idempotent: frees one slot only
	if _, _, ok := b.Begin(clk.Now()); !ok {
		t.Error("an abandoned probe did not free its slot")
	}
	if _, _, ok := b.Begin(clk.Now()); ok {
		t.Error("a double abandon freed two slots")
	}
}

// TestBreakerStaleOutcomes checks that requests admitted before a transition cannot move the
// breaker afterwards: a slow success from before the circuit opened does not count as a probe.
func TestBreakerStaleOutcomes(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1e9, 0))
	b := NewBreaker(BreakerConfig{FailureThreshold: 2, SuccessThreshold: 1, OpenTimeout: time.Second, Clock: clk.Now})
	slow, _, _ := b.Begin(clk.Now())
	runOps(t, b, clk, []op{"fail", "fail", "wait"})
	slow(true)
	if s := b.State(clk.Now()); s != HalfOpen {
		t.Errorf("a success admitted while closed moved the half-open circuit to %s", s)
	}
	slowFail, _, _ := b.Begin(clk.Now()) // a probe
	slowFail(false)
	if s := b.State(clk.Now()); s != Open {
		t.Errorf("a failed probe left the circuit %s", s)
	}
}

// TestBreakerDisabled always admits and never opens.
func TestBreakerDisabled(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1e9, 0))
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, Disabled: true, Clock: clk.Now})
	runOps(t, b, clk, []op{"fail", "fail", "fail"})
	if !b.Allows(clk.Now()) || b.State(clk.Now()) != Closed {
		t.Error("a disabled breaker opened")
	}
}

// TestBreakerConcurrent runs many requests at once under the race detector; the circuit must end
// open after failures and every probe slot must be returned.
func TestBreakerConcurrent(t *testing.T) {
	b := NewBreaker(BreakerConfig{FailureThreshold: 50, OpenTimeout: time.Hour})
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if done, _, ok := b.Begin(time.Now()); ok {
				done(false)
			}
		}()
	}
	wg.Wait()
	if s := b.State(time.Now()); s != Open {
		t.Errorf("state %s after 200 failures", s)
	}
}

func TestBreakerConfigWithLabels(t *testing.T) {
	base := DefaultBreakerConfig()
	got, err := base.WithLabels(map[string]string{LabelCBFailureThreshold: "4", LabelCBTimeout: "5s", LabelCBSuccessThreshold: "1", LabelCBHalfOpenProbes: "3", LabelCBDisabled: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if got.FailureThreshold != 4 || got.OpenTimeout != 5*time.Second || got.SuccessThreshold != 1 || got.HalfOpenProbes != 3 || !got.Disabled {
		t.Errorf("got %+v", got)
	}
	for _, bad := range []map[string]string{{LabelCBFailureThreshold: "-1"}, {LabelCBTimeout: "soon"}, {LabelCBDisabled: "maybe"}} {
		if _, err := base.WithLabels(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// TestBreakerClosed: the clock-free fast check agrees with the state.
func TestBreakerClosed(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1e9, 0))
	b := NewBreaker(BreakerConfig{FailureThreshold: 1, SuccessThreshold: 1, OpenTimeout: time.Second, Clock: clk.Now})
	if !b.Closed() {
		t.Error("a new breaker is not closed")
	}
	runOps(t, b, clk, []op{"fail"})
	if b.Closed() {
		t.Error("an open breaker reports closed")
	}
	runOps(t, b, clk, []op{"wait", "ok"})
	if !b.Closed() {
		t.Error("a breaker closed by its probe reports not closed")
	}
	if d := NewBreaker(BreakerConfig{Disabled: true}); !d.Closed() {
		t.Error("a disabled breaker reports not closed")
	}
}

func TestBreakerFailureRate(t *testing.T) {
	ops := func(s string) []op {
		var out []op
		for _, f := range strings.Fields(s) {
			out = append(out, op(f))
		}
		return out
	}
	cases := []struct {
		name string
		rate float64
		ops  string
		want CircuitState
	}{
		{name: "alternating trips at 50 %", rate: 0.5, ops: "fail ok fail ok fail", want: Open},
		{name: "waits for a full window", rate: 0.5, ops: "fail ok fail", want: Closed},
		{name: "a success never trips", rate: 0.5, ops: "ok fail fail ok", want: Closed},
		{name: "below the threshold", rate: 0.5, ops: "fail ok ok ok fail ok ok ok fail ok ok ok", want: Closed},
		{name: "old failures leave the window", rate: 0.5, ops: "fail fail ok ok ok ok fail", want: Closed},
		{name: "cancels are not outcomes", rate: 0.5, ops: "fail cancel cancel cancel fail", want: Closed},
		{name: "off by default", rate: 0, ops: strings.Repeat("fail ok ", 20), want: Closed},
		{name: "the window starts afresh when closed again", rate: 0.5, ops: "fail ok fail ok fail wait ok ok fail ok fail", want: Closed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := testutil.NewClock(time.Unix(1e9, 0))
			b := NewBreaker(BreakerConfig{FailureThreshold: 10, SuccessThreshold: 2, OpenTimeout: time.Second,
				FailureRateThreshold: tc.rate, FailureRateWindow: 4, Clock: clk.Now})
			runOps(t, b, clk, ops(tc.ops))
			if s := b.State(clk.Now()); s != tc.want {
				t.Errorf("state %s, want %s", s, tc.want)
			}
		})
	}
}

func TestBreakerConfigValidate(t *testing.T) {
	for _, c := range []BreakerConfig{{FailureRateThreshold: 1.5}, {FailureRateThreshold: -0.1}, {FailureThreshold: -1}} {
		if c.Validate() == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := DefaultBreakerConfig().WithLabels(map[string]string{LabelCBFailureRate: "2"}); err == nil {
		t.Error("a failure rate of 2 was accepted")
	}
	c, err := DefaultBreakerConfig().WithLabels(map[string]string{LabelCBFailureRate: "0.3", LabelCBFailureWindow: "50"})
	if err != nil || c.FailureRateThreshold != 0.3 || c.FailureRateWindow != 50 {
		t.Errorf("got %+v, %v", c, err)
	}
}
