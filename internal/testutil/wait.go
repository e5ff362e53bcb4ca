package testutil

// Recv and Until bound the waits of tests: a receive from a channel, or a condition with no
// channel to signal it, fails the test with a message after Deadline instead of hanging until the
// test binary's -timeout kills every test at once.

import (
	"testing"
	"time"
)

// Deadline is how long a test waits for something that should happen at once. It is long
// against the milliseconds these waits take, so that a loaded CI machine never trips it.
const Deadline = 10 * time.Second

// Recv returns the next value from ch, failing t (naming what it waited for) after Deadline. A
// closed channel (a done channel) gives its zero value at once.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return recvWithin(t, ch, what, Deadline)
}

func recvWithin[T any](t testing.TB, ch <-chan T, what string, d time.Duration) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", d, what)
		var zero T
		return zero
	}
}

// Until polls cond every millisecond or so until it holds, failing t after Deadline. It is for
// state that no channel announces (a counter dropped in deferred code); where a channel can
// signal, use Recv.
func Until(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", Deadline, what)
		}
		time.Sleep(time.Millisecond)
	}
}
