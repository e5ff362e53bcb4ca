package testutil

import (
	"testing"
	"time"
)

// fakeT records a Fatalf instead of ending the test that runs it.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(string, ...any) {
	f.failed = true
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, "a value"); got != 7 {
		t.Fatalf("got %d", got)
	}
	done := make(chan struct{})
	close(done)
	Recv(t, done, "a closed channel")
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, func() bool { n++; return n == 3 }, "the third call")
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// A wait that never ends fails at its deadline.
func TestRecvFailsAtTheDeadline(t *testing.T) {
	ft := &fakeT{}
	recvWithin(ft, make(chan int), "nothing", 10*time.Millisecond)
	if !ft.failed {
		t.Fatal("a receive that never came did not fail")
	}
}
