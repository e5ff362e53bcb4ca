package flow

import (
	"testing"
	"time"
)

// fakePool is a pool of engines without reports, each taking requests up to its slots plus the
// saturation's MaxWaiting, its in-flight count raised by each grant sent to it; wait, when set,
// is every engine's own predicted wait, best the routing cost's prompt-less prediction.
type fakePool struct {
	inflight []int64
	wait     []float64 // seconds; nil: the engines report no queued prefill
	best     float64
	hasBest  bool
	judged   int // Signals calls
}

func (p *fakePool) Len() int { return len(p.inflight) }

func (p *fakePool) Signals(i int, _ time.Time) Signals {
	p.judged++
	sig := Signals{Available: true, Inflight: p.inflight[i], Slots: 2}
	if p.wait != nil {
		sig.HasReport, sig.Running, sig.PredictedWait, sig.HasWait = true, p.inflight[i], p.wait[i], true
	}
	return sig
}

func (p *fakePool) BestWait() (float64, bool) { return p.best, p.hasBest }

func newTestAdmission(t *testing.T) (*Admission, *time.Time) {
	t.Helper()
	now := t0
	c := Config{Enabled: true, Saturation: Saturation{MaxWaiting: -1, MaxPredictedWait: time.Second}}.WithDefaults()
	return NewAdmission(c, func() time.Time { return now }), &now
}

func push(t *testing.T, a *Admission, n int) {
	t.Helper()
	for i := range n {
		if err := a.Queue.Push(&Entry{Tenant: "t", Cost: 1, Owner: i}, a.Now()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdmissionDispatchJudgesEachGrant: Dispatch judges the pool afresh before each grant, so
// that a grant that reached an engine at once (the simulator's) is counted as much as one the
// caller holds pending (the gateway's), and it stops at the pool's capacity either way.
func TestAdmissionDispatchJudgesEachGrant(t *testing.T) {
	for _, held := range []bool{false, true} {
		a, _ := newTestAdmission(t)
		p := &fakePool{inflight: make([]int64, 2)} // 2 engines of 2 slots, no waiting: 4 in all
		push(t, a, 6)
		pending := 0.0
		var order []int
		next := a.Dispatch(p, func() float64 { return pending }, func(e *Entry, now time.Time) {
			if !now.Equal(t0) {
				t.Fatalf("granted at %v, want the clock's %v", now, t0)
			}
			order = append(order, e.Owner.(int))
			if held {
				pending++ // the gateway: the request picks its engine later
				return
			}
			p.inflight[len(order)%2]++ // the simulator: the request is at an engine now
		})
		if len(order) != 4 || a.Queue.Len() != 2 || next != 0 {
			t.Fatalf("held %v: granted %v, %d left queued, next %v; want 4 granted in arrival order, 2 left, no drain", held, order, a.Queue.Len(), next)
		}
		for i, o := range order {
			if o != i {
				t.Fatalf("held %v: granted %v, want arrival order", held, order)
			}
		}
		if p.judged != 2*5 {
			t.Fatalf("held %v: %d engine judgements, want both engines before each of 4 grants and the stop", held, p.judged)
		}
	}
}

// TestAdmissionAdmitNow: a request goes to an engine at once only while the queue is empty and
// the pool takes more than the pending requests.
func TestAdmissionAdmitNow(t *testing.T) {
	a, _ := newTestAdmission(t)
	p := &fakePool{inflight: []int64{1}} // one slot of two free
	if !a.AdmitNow(p, 0) {
		t.Fatal("refused with a free slot and nothing pending")
	}
	if a.AdmitNow(p, 1) {
		t.Fatal("admitted with the free slot held by a pending request")
	}
	push(t, a, 1)
	if a.AdmitNow(p, 0) {
		t.Fatal("admitted past a queued request")
	}
}

// TestAdmissionDrain: when only the engines' own queued prefill holds the queue, Dispatch says
// when the first is predicted below the bound; where they report none, the routing cost's
// prediction at the bound shuts the pool, and the wake is bounded.
func TestAdmissionDrain(t *testing.T) {
	a, _ := newTestAdmission(t)
	p := &fakePool{inflight: []int64{0, 0}, wait: []float64{1.5, 1.25}}
	push(t, a, 1)
	if next := a.Dispatch(p, nil, func(*Entry, time.Time) { t.Fatal("granted past the bound") }); next != 250*time.Millisecond+time.Millisecond {
		t.Fatalf("next %v, want the second engine's 250ms over the bound plus 1ms", next)
	}
	p.wait[1] = 0.5
	granted := 0
	a.Dispatch(p, nil, func(*Entry, time.Time) { granted++ })
	if granted != 1 || len(a.Open()) != 2 {
		t.Fatalf("granted %d, open %v: want the engine under the bound to take it, both able to start", granted, a.Open())
	}
	q := &fakePool{inflight: []int64{0}, best: 2, hasBest: true} // no own wait: the cost's 2 s decides
	if room, next := a.Headroom(q, a.Now(), 1e9); room != 0 || next != time.Second+time.Millisecond {
		t.Fatalf("room %g next %v, want the pool shut for the 1 s over the bound", room, next)
	}
	q.best = 1e9
	if _, next := a.Headroom(q, a.Now(), 1e9); next != maxDrain*time.Second+time.Millisecond {
		t.Fatalf("next %v, want it bounded at %d s", next, maxDrain)
	}
	if l := a.Level(q); l != 1 {
		t.Fatalf("level %g with the cost's wait past the bound, want 1", l)
	}
	if l := a.Level(&fakePool{inflight: []int64{1, 0}}); l != 0.25 {
		t.Fatalf("level %g, want the mean of 1/2 and 0", l)
	}
}
