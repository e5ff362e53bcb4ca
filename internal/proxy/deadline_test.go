package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// TestDeadlinesAsWithTimeout: a request's bounded context ends as context.WithTimeout's would:
// DeadlineExceeded (error and cause) when its bound passes, Canceled when it is released, the
// parent's error and cause when the parent ends first (the client left; the gateway shuts
// down), and it reports its bound as its deadline.
func TestDeadlinesAsWithTimeout(t *testing.T) {
	t.Run("bound passes", func(t *testing.T) {
		l := &deadlines{d: 20 * time.Millisecond}
		before := time.Now()
		c := l.bound(context.Background())
		defer l.release(c)
		if dl, ok := c.Deadline(); !ok || dl.Before(before.Add(l.d)) || dl.After(time.Now().Add(l.d)) {
			t.Fatalf("Deadline = %v, %v; want about %v from now", dl, ok, l.d)
		}
		if c.Err() != nil {
			t.Fatalf("Err before the bound = %v", c.Err())
		}
		<-c.Done()
		if time.Now().Before(before.Add(l.d)) {
			t.Fatal("ended before its bound")
		}
		if !errors.Is(c.Err(), context.DeadlineExceeded) || c.Err() != context.DeadlineExceeded {
			t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
		}
		if context.Cause(c) != context.DeadlineExceeded {
			t.Fatalf("Cause = %v, want DeadlineExceeded", context.Cause(c))
		}
	})
	t.Run("released", func(t *testing.T) {
		l := &deadlines{d: time.Hour}
		c := l.bound(context.Background())
		l.release(c)
		<-c.Done()
		if c.Err() != context.Canceled || context.Cause(c) != context.Canceled {
			t.Fatalf("Err, Cause = %v, %v; want Canceled", c.Err(), context.Cause(c))
		}
		if l.head != nil || l.tail != nil {
			t.Fatal("a released request is still listed")
		}
	})
	t.Run("client leaves", func(t *testing.T) {
		l := &deadlines{d: time.Hour}
		parent, leave := context.WithCancel(context.Background())
		c := l.bound(parent)
		defer l.release(c)
		leave()
		<-c.Done()
		if c.Err() != context.Canceled {
			t.Fatalf("Err = %v, want Canceled", c.Err())
		}
	})
	t.Run("shutdown cause", func(t *testing.T) {
		l := &deadlines{d: time.Hour}
		parent, stop := context.WithCancelCause(context.Background())
		c := l.bound(parent)
		defer l.release(c)
		stop(ErrShuttingDown)
		<-c.Done()
		if k, _ := classify(c, c.Err(), false, false); k != KindShutdown {
			t.Fatalf("kind = %v, want shutdown (Err %v, Cause %v)", k, c.Err(), context.Cause(c))
		}
	})
	t.Run("earlier parent deadline", func(t *testing.T) {
		l := &deadlines{d: time.Hour}
		parent, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		c := l.bound(parent)
		defer l.release(c)
		if pd, _ := parent.Deadline(); !func() bool { dl, _ := c.Deadline(); return dl.Equal(pd) }() {
			t.Fatal("the parent's earlier deadline is not reported")
		}
		if l.head != nil {
			t.Fatal("a request bounded by its parent is listed")
		}
		<-c.Done()
		if c.Err() != context.DeadlineExceeded {
			t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
		}
	})
	t.Run("value", func(t *testing.T) {
		type key struct{}
		l := &deadlines{d: time.Hour}
		c := l.bound(context.WithValue(context.Background(), key{}, "v"))
		defer l.release(c)
		if c.Value(key{}) != "v" {
			t.Fatal("the parent's values are lost")
		}
	})
}

// TestDeadlinesList: requests leave the list from anywhere, and the timer, set for the head,
// ends each request at its own bound, in order, however many came and went before it; once
// none is left the timer is not set again.
func TestDeadlinesList(t *testing.T) {
	l := &deadlines{d: 30 * time.Millisecond}
	var cs []*deadlineCtx
	for range 5 {
		cs = append(cs, l.bound(context.Background()))
	}
	// Released from the head, the middle and the tail: the rest stay bounded.
	l.release(cs[0])
	l.release(cs[2])
	l.release(cs[4])
	for _, i := range []int{1, 3} {
		<-cs[i].Done()
		if cs[i].Err() != context.DeadlineExceeded {
			t.Fatalf("request %d: Err = %v, want DeadlineExceeded", i, cs[i].Err())
		}
		l.release(cs[i])
	}
	// A request bounded after the timer went idle is ended in its turn.
	later := l.bound(context.Background())
	defer l.release(later)
	<-later.Done()
	if later.Err() != context.DeadlineExceeded {
		t.Fatalf("Err = %v, want DeadlineExceeded", later.Err())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head != nil || l.tail != nil || l.armed {
		t.Fatalf("after every bound passed: head %v, tail %v, armed %v", l.head, l.tail, l.armed)
	}
}

// TestRequestTimeoutCutsASlowWorker: through Forward, a worker that does not answer within
// RequestTimeout is abandoned (the transport's own context, derived from the bounded one, ends
// with it: the worker sees its request cancelled) and the request fails as a timeout (504).
func TestRequestTimeoutCutsASlowWorker(t *testing.T) {
	gone := make(chan struct{})
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(gone)
	})
	f := New(Config{RequestTimeout: 50 * time.Millisecond, Retry: RetryConfig{MaxAttempts: 1}})
	start := time.Now()
	res := f.Forward(context.Background(), httptest.NewRecorder(), &Request{Path: "/x", Body: []byte(`{}`), Header: http.Header{}}, inOrder(a))
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("ended after %v, before the request's bound", took)
	}
	if !isKind(res.Err, KindTimeout) || res.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d, error %v; want a timeout (504)", res.Status, res.Err)
	}
	testutil.Recv(t, gone, "the cancel at the slow worker")
}

// TestDeadlinesConcurrent: requests bounded and released from several goroutines while the
// timer fires between them (run under -race) each end once, with one of the two reasons, and
// leave the list empty.
func TestDeadlinesConcurrent(t *testing.T) {
	l := &deadlines{d: time.Millisecond}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 300 {
				c := l.bound(context.Background())
				if i%3 == 0 {
					<-c.Done()
				}
				l.release(c)
				if err := c.Err(); err != context.Canceled && err != context.DeadlineExceeded {
					t.Errorf("Err = %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head != nil || l.tail != nil {
		t.Fatal("released requests are still listed")
	}
}
