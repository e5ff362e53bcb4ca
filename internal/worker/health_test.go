package worker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeProbes answers health checks per worker URL and counts them; a worker set to hang blocks
// until the check's context ends.
type fakeProbes struct {
	mu    sync.Mutex
	fail  map[string]bool
	hang  map[string]bool
	calls map[string]int
	paths map[string]string
}

func newFakeProbes() *fakeProbes {
	return &fakeProbes{fail: map[string]bool{}, hang: map[string]bool{}, calls: map[string]int{}, paths: map[string]string{}}
}

func (p *fakeProbes) probe(ctx context.Context, w *Worker, path string) error {
	p.mu.Lock()
	p.calls[w.Spec.URL]++
	p.paths[w.Spec.URL] = path
	fail, hang := p.fail[w.Spec.URL], p.hang[w.Spec.URL]
	p.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if fail {
		return errors.New("injected failure")
	}
	return nil
}

func (p *fakeProbes) set(w *Worker, fail, hang bool) {
	p.mu.Lock()
	p.fail[w.Spec.URL], p.hang[w.Spec.URL] = fail, hang
	p.mu.Unlock()
}

func (p *fakeProbes) count(w *Worker) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[w.Spec.URL]
}

// transitions records every transition the checker reports.
type transitions struct {
	mu  sync.Mutex
	got []string
}

func (tr *transitions) record(w *Worker, from, to Health) {
	tr.mu.Lock()
	tr.got = append(tr.got, from.String()+">"+to.String())
	tr.mu.Unlock()
}

func (tr *transitions) list() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.got, " ")
}

func mustWorker(t *testing.T, url string, labels map[string]string) *Worker {
	t.Helper()
	w, err := New(Spec{URL: url, Models: []string{"m"}, Labels: labels}, BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestCheckerStateMachine walks one worker through pending → ready → not_ready → ready with the
// default thresholds (2 successes, 3 failures) at the default 10 s interval, in virtual time.
func TestCheckerStateMachine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		probes := newFakeProbes()
		var tr transitions
		var logs bytes.Buffer
		c := NewChecker(reg, HealthConfig{}, CheckerOptions{Probe: probes.probe, OnTransition: tr.record,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		c.Start(t.Context())
		defer c.Stop()
		w := mustWorker(t, "http://10.0.0.1:8000", nil)
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
		step := func(d time.Duration) { time.Sleep(d); synctest.Wait() }

		step(0) // the new worker is checked at once: 1 success
		if w.Health() != Pending || probes.count(w) != 1 {
			t.Fatalf("after 1 check: %s, %d checks", w.Health(), probes.count(w))
		}
		step(10 * time.Second) // 2 successes
		if w.Health() != Ready {
			t.Fatalf("after 2 successes: %s", w.Health())
		}
		probes.set(w, true, false)
		step(20 * time.Second) // 2 failures: still ready
		if w.Health() != Ready {
			t.Fatalf("after 2 failures: %s", w.Health())
		}
		step(10 * time.Second) // the 3rd
		if w.Health() != NotReady {
			t.Fatalf("after 3 failures: %s", w.Health())
		}
		step(30 * time.Second) // more failures change nothing
		probes.set(w, false, false)
		step(10 * time.Second)
		if w.Health() != NotReady {
			t.Fatalf("after 1 success: %s", w.Health())
		}
		step(10 * time.Second)
		if w.Health() != Ready {
			t.Fatalf("after 2 successes: %s", w.Health())
		}
		if got, want := tr.list(), "pending>ready ready>not_ready not_ready>ready"; got != want {
			t.Errorf("transitions %q, want %q", got, want)
		}
		if n := strings.Count(logs.String(), "worker health changed"); n != 3 {
			t.Errorf("%d transition log lines, want 3:\n%s", n, logs.String())
		}
		if n := probes.count(w); n != 10 {
			t.Errorf("%d checks in 90 s at a 10 s interval, want 10", n)
		}
	})
}

// TestCheckerTimeoutAndOverrides checks a hanging worker fails by timeout, and that labels
// override the interval, thresholds and path for one worker only.
func TestCheckerTimeoutAndOverrides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		probes := newFakeProbes()
		c := NewChecker(reg, HealthConfig{Interval: 10 * time.Second, Timeout: 2 * time.Second}, CheckerOptions{Probe: probes.probe,
			Logger: slog.New(slog.DiscardHandler)})
		c.Start(t.Context())
		defer c.Stop()
		plain := mustWorker(t, "http://10.0.0.1:8000", nil)
		fast := mustWorker(t, "http://10.0.0.2:8000", map[string]string{
			LabelHealthInterval: "1s", LabelHealthFailureThreshold: "1", LabelHealthPath: "/ping",
		})
		plain.SetHealth(Ready)
		fast.SetHealth(Ready)
		probes.set(plain, false, true)
		probes.set(fast, false, true)
		for _, w := range []*Worker{plain, fast} {
			if err := reg.Add(w); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if fast.Health() != Ready || plain.Health() != Ready {
			t.Fatalf("before the 2 s timeout: fast %s plain %s", fast.Health(), plain.Health())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if fast.Health() != NotReady {
			t.Errorf("fast worker after one timed-out check: %s, want not_ready", fast.Health())
		}
		time.Sleep(25 * time.Second)
		synctest.Wait()
		if plain.Health() != NotReady {
			t.Errorf("plain worker after 3 timed-out checks: %s", plain.Health())
		}
		// fast: each check lasts the 2 s timeout, longer than its 1 s interval, so one starts
		// every 2 s; plain: one every 10 s.
		if n := probes.count(fast); n < 12 || n > 15 {
			t.Errorf("fast worker: %d checks in 27 s, want about 14", n)
		}
		if n := probes.count(plain); n != 3 {
			t.Errorf("plain worker: %d checks in 27 s, want 3", n)
		}
		probes.mu.Lock()
		path := probes.paths[fast.Spec.URL]
		probes.mu.Unlock()
		if path != "/ping" {
			t.Errorf("fast worker probed at %q, want /ping", path)
		}
	})
}

// TestCheckerFollowsRegistry stops checking a removed worker and promotes a worker added not
// ready, without waiting for an interval.
func TestCheckerFollowsRegistry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		probes := newFakeProbes()
		c := NewChecker(reg, HealthConfig{SuccessThreshold: 1}, CheckerOptions{Probe: probes.probe, Logger: slog.New(slog.DiscardHandler)})
		c.Start(t.Context())
		defer c.Stop()
		a := mustWorker(t, "http://10.0.0.1:8000", nil)
		a.SetHealth(NotReady)
		time.Sleep(time.Hour) // the checker is idle with no workers
		if err := reg.Add(a); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if a.Health() != Ready {
			t.Fatalf("added worker not promoted at once: %s", a.Health())
		}
		if _, err := reg.Remove(a.ID); err != nil {
			t.Fatal(err)
		}
		before := probes.count(a)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := probes.count(a); n != before {
			t.Errorf("removed worker checked %d more times", n-before)
		}
	})
}

// TestCheckerDisabled takes workers as ready and probes nothing.
func TestCheckerDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := NewRegistry()
		probes := newFakeProbes()
		c := NewChecker(reg, HealthConfig{Disabled: true}, CheckerOptions{Probe: probes.probe, Logger: slog.New(slog.DiscardHandler)})
		c.Start(t.Context())
		defer c.Stop()
		w := mustWorker(t, "http://10.0.0.1:8000", nil)
		w.SetHealth(NotReady)
		if err := reg.Add(w); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if w.Health() != Ready || probes.count(w) != 0 {
			t.Errorf("disabled: health %s after %d checks, want ready after 0", w.Health(), probes.count(w))
		}
	})
}

// TestCheckerStopWithoutStart and a double Stop must not block.
func TestCheckerStopIdempotent(t *testing.T) {
	c := NewChecker(NewRegistry(), HealthConfig{}, CheckerOptions{})
	c.Stop()
	c.Start(context.Background())
	c.Stop()
	c.Stop()
}

// TestHTTPProbe checks the default probe against a real loopback server: 2xx passes, anything
// else fails, and the API key is sent.
// defaultProbe returns a checker with the default HTTP probe and a worker at url with api key
// "k".
func defaultProbe(t *testing.T, url string) (*Checker, *Worker) {
	t.Helper()
	c := NewChecker(NewRegistry(), HealthConfig{}, CheckerOptions{})
	t.Cleanup(c.Stop)
	w, err := New(Spec{URL: url, APIKey: "k"}, BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func TestHTTPProbe(t *testing.T) {
	var status int
	var mu sync.Mutex
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		auth = r.Header.Get("Authorization")
		if r.URL.Path != "/health" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	c, w := defaultProbe(t, srv.URL)
	for _, tc := range []struct {
		status int
		ok     bool
	}{{200, true}, {204, true}, {503, false}, {404, false}} {
		mu.Lock()
		status = tc.status
		mu.Unlock()
		err := c.opts.Probe(context.Background(), w, "/health")
		if (err == nil) != tc.ok {
			t.Errorf("status %d: err %v", tc.status, err)
		}
	}
	if auth != "Bearer k" {
		t.Errorf("Authorization %q", auth)
	}
	srv.Close()
	if err := c.opts.Probe(context.Background(), w, "/health"); err == nil {
		t.Error("a closed server passed its check")
	}
}

// TestHTTPProbeRedirects: the default probe follows a worker's redirects on its own origin, up
// to MaxRedirects, and never one to another address: a worker must not be able to point the
// gateway's probes at a host nobody registered. A redirect it does not follow fails the probe.
func TestHTTPProbeRedirects(t *testing.T) {
	var elsewhere sync.Mutex
	hitElsewhere := 0
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Lock()
		hitElsewhere++
		elsewhere.Unlock()
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health": // moved, on this host
			http.Redirect(w, r, "/health/", http.StatusMovedPermanently)
		case "/health/":
			w.WriteHeader(http.StatusOK)
		case "/away":
			http.Redirect(w, r, other.URL+"/health", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		}
	}))
	defer srv.Close()
	c, w := defaultProbe(t, srv.URL)
	if err := c.opts.Probe(context.Background(), w, "/health"); err != nil {
		t.Errorf("a redirect on the worker's own host: %v", err)
	}
	if err := c.opts.Probe(context.Background(), w, "/away"); err == nil || !strings.Contains(err.Error(), "302") {
		t.Errorf("a redirect to another host: err %v, want the 302 as a failed check", err)
	}
	if hitElsewhere != 0 {
		t.Errorf("the other host was reached %d times", hitElsewhere)
	}
	if err := c.opts.Probe(context.Background(), w, "/loop"); err == nil {
		t.Error("an endless redirect passed its check")
	}
}

func TestHealthConfigWithLabels(t *testing.T) {
	base := DefaultHealthConfig()
	cases := []struct {
		name    string
		labels  map[string]string
		wantErr string
		check   func(HealthConfig) bool
	}{
		{name: "none", check: func(c HealthConfig) bool { return c == base }},
		{name: "all", labels: map[string]string{LabelHealthPath: "/ready", LabelHealthInterval: "2s", LabelHealthTimeout: "500ms",
			LabelHealthSuccessThreshold: "1", LabelHealthFailureThreshold: "5", LabelHealthDisabled: "true"},
			check: func(c HealthConfig) bool {
				return c == HealthConfig{Path: "/ready", Interval: 2 * time.Second, Timeout: 500 * time.Millisecond, SuccessThreshold: 1, FailureThreshold: 5, Disabled: true}
			}},
		{name: "bad interval", labels: map[string]string{LabelHealthInterval: "often"}, wantErr: "health_check_interval"},
		{name: "zero threshold", labels: map[string]string{LabelHealthFailureThreshold: "0"}, wantErr: "health_failure_threshold"},
		{name: "relative path", labels: map[string]string{LabelHealthPath: "health"}, wantErr: "must start with /"},
		{name: "bad bool", labels: map[string]string{LabelHealthDisabled: "perhaps"}, wantErr: "disable_health_check"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := base.WithLabels(tc.labels)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Errorf("got %+v, %v", c, err)
			}
		})
	}
}

// TestLabelBounds: labels come from whoever may register a worker, so a value that would burn a
// core (a check every nanosecond) or memory (a huge outcome window) is refused.
func TestLabelBounds(t *testing.T) {
	for _, labels := range []map[string]string{
		{LabelHealthInterval: "1ns"},
		{LabelHealthInterval: "1000h"},
		{LabelHealthTimeout: "1us"},
		{LabelHealthFailureThreshold: "1000000000"},
		{LabelHealthPath: "/x?y=1"},
		{LabelHealthPath: "/" + strings.Repeat("a", 300)},
	} {
		if _, err := DefaultHealthConfig().WithLabels(labels); err == nil {
			t.Errorf("health labels %v accepted", labels)
		}
	}
	for _, labels := range []map[string]string{
		{LabelCBTimeout: "1ns"},
		{LabelCBFailureWindow: "100000000"},
		{LabelCBHalfOpenProbes: "0"},
	} {
		if _, err := DefaultBreakerConfig().WithLabels(labels); err == nil {
			t.Errorf("breaker labels %v accepted", labels)
		}
	}
	if _, err := DefaultHealthConfig().WithLabels(map[string]string{LabelHealthInterval: "2s", LabelHealthTimeout: "500ms"}); err != nil {
		t.Errorf("sane labels refused: %v", err)
	}
}

// TestRedactedURL: credentials in a worker URL are used for requests and never shown.
func TestRedactedURL(t *testing.T) {
	w, err := New(Spec{URL: "http://user:s3cret@10.0.0.5:8000/"}, BreakerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(w.Spec.URL, "s3cret") || strings.Contains(w.Spec.URL, "user") || w.Spec.URL != "http://redacted@10.0.0.5:8000" {
		t.Errorf("shown URL %q", w.Spec.URL)
	}
	if p, _ := w.URL.User.Password(); p != "s3cret" {
		t.Errorf("the request URL lost its credentials")
	}
	plain, _ := New(Spec{URL: "http://10.0.0.5:8000"}, BreakerConfig{})
	if plain.ID != w.ID {
		t.Errorf("ids differ by credentials: %s vs %s", plain.ID, w.ID)
	}
	if _, err := ParseURL("http://u:s3cret@h:1/?q=1"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v", err)
	}
	if _, err := ParseURL("http://u:s3cret@h:bad port"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v", err)
	}
}
