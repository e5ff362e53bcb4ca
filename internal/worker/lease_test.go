package worker

import (
	"testing"
	"time"
)

func TestNewRefusesAPIKeysThatCannotBeSent(t *testing.T) {
	for _, key := range []string{"k\r\nX-Evil: 1", "k\n", "k\x00", "ключ"} {
		if _, err := New(Spec{URL: "http://127.0.0.1:1", APIKey: key}, BreakerConfig{}); err == nil {
			t.Errorf("api key %q accepted", key)
		}
	}
	if _, err := New(Spec{URL: "http://127.0.0.1:1", APIKey: "sk-abc_123.XYZ"}, BreakerConfig{}); err != nil {
		t.Errorf("a plain key refused: %v", err)
	}
}

// TestLeaseSettlesOnce: a lease holds an in-flight slot and a half-open probe slot until End,
// End counts the outcome once, and an abandoned attempt tells the breaker nothing.
func TestLeaseSettlesOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	w, _ := New(Spec{URL: "http://127.0.0.1:1"}, BreakerConfig{FailureThreshold: 1, OpenTimeout: time.Second, Clock: func() time.Time { return now }})
	l, ok := w.Begin(now)
	if !ok || w.Inflight() != 1 {
		t.Fatalf("admitted %v, in flight %d", ok, w.Inflight())
	}
	l.End(Abandoned)
	l.End(Failed) // no effect: already ended
	if w.Inflight() != 0 || w.Processed() != 1 || w.Breaker.State(now) != Closed {
		t.Fatalf("in flight %d, processed %d, circuit %s", w.Inflight(), w.Processed(), w.Breaker.State(now))
	}
	l, _ = w.Begin(now)
	l.End(Failed)
	if w.Breaker.State(now) != Open {
		t.Fatal("a failed attempt did not reach the breaker")
	}
	if _, ok := w.Begin(now); ok {
		t.Fatal("an open circuit admitted an attempt")
	}
	now = now.Add(2 * time.Second) // half-open: one probe slot
	probe, ok := w.Begin(now)
	if !ok {
		t.Fatal("half-open circuit refused its probe")
	}
	if _, ok := w.Begin(now); ok {
		t.Fatal("a second probe was admitted while the first holds the slot")
	}
	probe.End(Abandoned)
	if _, ok := w.Begin(now); !ok {
		t.Fatal("the probe slot was not returned by End")
	}
	w.Drain()
	if _, ok := w.Begin(now); ok {
		t.Fatal("a draining worker admitted an attempt")
	}
}

// TestAwaitingCounts: Begin and Track count a request as awaiting its first byte until FirstByte
// (or first) or the end, whichever comes first, exactly once.
func TestAwaitingCounts(t *testing.T) {
	w, err := New(Spec{URL: "http://127.0.0.1:1"}, BreakerConfig{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	l1, _ := w.Begin(time.Now())
	l2, _ := w.Begin(time.Now())
	first, release := w.Track()
	if w.Awaiting() != 3 || w.Inflight() != 3 {
		t.Fatalf("awaiting %d, in flight %d; want 3 and 3", w.Awaiting(), w.Inflight())
	}
	l1.FirstByte()
	l1.FirstByte()
	first()
	first()
	if w.Awaiting() != 1 {
		t.Fatalf("after two first bytes: awaiting %d, want 1", w.Awaiting())
	}
	l1.End(Succeeded)
	l1.FirstByte() // after End: nothing
	l2.End(Failed) // ends without a first byte
	release()
	release()
	if w.Awaiting() != 0 || w.Inflight() != 0 {
		t.Fatalf("after the ends: awaiting %d, in flight %d", w.Awaiting(), w.Inflight())
	}
}
