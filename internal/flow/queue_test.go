package flow

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ent(tenant string, prio int) *Entry {
	return &Entry{Tenant: tenant, Priority: prio, Cost: 1, Bytes: 10, Owner: tenant}
}

func TestQueueStrictBandsAndFIFO(t *testing.T) {
	q := NewQueue(Config{Aging: -1})
	a, b, c, d := ent("x", 0), ent("x", 5), ent("x", 0), ent("x", -3)
	for i, e := range []*Entry{a, b, c, d} {
		if err := q.Push(e, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	want := []*Entry{b, a, c, d}
	for i, w := range want {
		if got := q.Pop(t0.Add(time.Hour)); got != w {
			t.Fatalf("pop %d: got priority %d, want %d", i, got.Priority, w.Priority)
		}
	}
	if q.Pop(t0) != nil || q.Len() != 0 || q.Bytes() != 0 {
		t.Fatalf("queue not empty: len %d bytes %d", q.Len(), q.Bytes())
	}
}

func TestQueueAgingPreventsStarvation(t *testing.T) {
	q := NewQueue(Config{Aging: time.Second, Timeout: time.Hour})
	low := ent("x", 0)
	_ = q.Push(low, t0)
	// A steady stream of high-priority requests, one queued at each step: the low one goes
	// once it has waited (1-0)·Aging longer than the oldest high one.
	var servedAt time.Duration
	for step := 0; step < 100; step++ {
		now := t0.Add(time.Duration(step) * 100 * time.Millisecond)
		_ = q.Push(ent("y", 1), now)
		if q.Pop(now) == low {
			servedAt = now.Sub(t0)
			break
		}
	}
	if servedAt == 0 {
		t.Fatal("the low band starved")
	}
	if servedAt < 900*time.Millisecond || servedAt > 1100*time.Millisecond {
		t.Errorf("low served after %v, want about one Aging (1s)", servedAt)
	}
}

func TestQueueFairShareWeighted(t *testing.T) {
	for _, tc := range []struct {
		wa, wb float64
		want   float64 // a's share
	}{{1, 1, 0.5}, {3, 1, 0.75}} {
		t.Run(fmt.Sprint(tc.wa, ":", tc.wb), func(t *testing.T) {
			q := NewQueue(Config{MaxRequests: 10000, Timeout: time.Hour})
			// a is queued ten times as much as b; both stay backlogged.
			for i := 0; i < 1000; i++ {
				_ = q.Push(&Entry{Tenant: "a", Weight: tc.wa, Cost: 100}, t0)
				if i%10 == 0 {
					_ = q.Push(&Entry{Tenant: "b", Weight: tc.wb, Cost: 100}, t0)
				}
			}
			na := 0
			for i := 0; i < 80; i++ {
				if q.Pop(t0).Tenant == "a" {
					na++
				}
			}
			if got := float64(na) / 80; got < tc.want-0.03 || got > tc.want+0.03 {
				t.Errorf("a's share %.3f, want %.2f", got, tc.want)
			}
		})
	}
}

func TestQueueIdleTenantGetsNoBacklogPenalty(t *testing.T) {
	q := NewQueue(Config{MaxRequests: 10000, Timeout: time.Hour})
	for i := 0; i < 500; i++ {
		_ = q.Push(&Entry{Tenant: "noisy", Cost: 10}, t0)
	}
	for i := 0; i < 100; i++ {
		q.Pop(t0)
	}
	quiet := &Entry{Tenant: "quiet", Cost: 10}
	_ = q.Push(quiet, t0)
	if got := q.Pop(t0); got != quiet {
		t.Fatalf("a newly active tenant waits behind the backlog of another: got %s", got.Tenant)
	}
}

func TestQueueBoundsAndRemove(t *testing.T) {
	q := NewQueue(Config{MaxRequests: 2, MaxBytes: 25})
	a, b := ent("x", 0), ent("y", 1)
	if q.Push(a, t0) != nil || q.Push(b, t0) != nil {
		t.Fatal("push failed")
	}
	if err := q.Push(ent("z", 0), t0); err != ErrFull {
		t.Errorf("third push: %v, want ErrFull", err)
	}
	if err := q.Push(a, t0); err != ErrQueued {
		t.Errorf("double push: %v, want ErrQueued", err)
	}
	if !q.Remove(a) || q.Remove(a) {
		t.Error("Remove reports wrongly")
	}
	if err := q.Push(&Entry{Bytes: 16}, t0); err != ErrBytes {
		t.Errorf("push past bytes: %v, want ErrBytes", err)
	}
	if q.Len() != 1 || q.Bytes() != 10 {
		t.Errorf("len %d bytes %d, want 1 and 10", q.Len(), q.Bytes())
	}
	if q.Pop(t0) != b || q.Len() != 0 || q.Bytes() != 0 {
		t.Error("the queue did not empty")
	}
}

func TestQueueExpire(t *testing.T) {
	q := NewQueue(Config{Timeout: 10 * time.Second})
	a := ent("x", 0)
	slo := ent("x", 0)
	slo.Deadline = t0.Add(time.Second)
	late := ent("x", 0)
	late.Deadline = t0.Add(time.Hour) // never past Timeout
	_ = q.Push(a, t0)
	_ = q.Push(slo, t0)
	_ = q.Push(late, t0.Add(time.Second))
	if at, _ := q.NextDeadline(); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("next deadline %v", at.Sub(t0))
	}
	got := q.Expire(t0.Add(time.Second), nil)
	if len(got) != 1 || got[0] != slo || !slo.ShortDeadline() {
		t.Fatalf("expired %v, want the SLO entry", len(got))
	}
	got = q.Expire(t0.Add(10*time.Second), got[:0])
	if len(got) != 1 || got[0] != a {
		t.Fatalf("expired %d at 10s, want a", len(got))
	}
	if !late.Deadline.Equal(t0.Add(11*time.Second)) || late.ShortDeadline() {
		t.Errorf("deadline past the timeout kept: %v", late.Deadline.Sub(t0))
	}
	if q.Len() != 1 {
		t.Errorf("len %d", q.Len())
	}
}

// TestQueueAgainstModel drives random pushes, pops, removes and expiries and checks every
// entry leaves exactly once, the counts match, the heap stays a heap, and every pop is in order:
// from the highest band or the band aging lets win (checkPopOrder), and within its band the oldest
// entry of its tenant.
func TestQueueAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	aging := 100 * time.Millisecond
	q := NewQueue(Config{MaxRequests: 64, MaxBytes: 1 << 20, Timeout: time.Second, Aging: aging})
	in := map[*Entry]bool{}
	seq := map[*Entry]int{}
	var bytes int64
	now := t0
	for step := 0; step < 20000; step++ {
		now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
		switch r := rng.IntN(10); {
		case r < 5:
			e := &Entry{Tenant: fmt.Sprint(rng.IntN(4)), Priority: rng.IntN(5) - 2, Cost: float64(rng.IntN(100)), Bytes: int64(rng.IntN(1000)), Weight: float64(1 + rng.IntN(3))}
			if q.Push(e, now) == nil {
				in[e] = true
				seq[e] = step
				bytes += e.Bytes
			}
		case r < 7:
			if e := q.Pop(now); e != nil {
				if !in[e] {
					t.Fatal("popped an entry not queued")
				}
				checkPopOrder(t, step, e, in, seq, now, aging)
				delete(in, e)
				bytes -= e.Bytes
			}
		case r < 8:
			for e := range in {
				if !q.Remove(e) {
					t.Fatal("remove of a queued entry failed")
				}
				delete(in, e)
				bytes -= e.Bytes
				break
			}
		default:
			for _, e := range q.Expire(now, nil) {
				if !in[e] || e.Deadline.After(now) {
					t.Fatal("expired wrongly")
				}
				delete(in, e)
				bytes -= e.Bytes
			}
		}
		if q.Len() != len(in) || q.Bytes() != bytes {
			t.Fatalf("step %d: len %d/%d bytes %d/%d", step, q.Len(), len(in), q.Bytes(), bytes)
		}
		for i := 1; i < len(q.deadlines); i++ {
			if q.deadlines[i].Deadline.Before(q.deadlines[(i-1)/2].Deadline) || q.deadlines[i].heapIdx != i {
				t.Fatal("heap broken")
			}
		}
	}
}

// checkPopOrder fails t unless e, just popped at now from the entries in, came from the highest
// band queued or from the band of the highest effective priority (its priority plus its oldest
// entry's wait in units of aging), and was its tenant's oldest entry in that band.
func checkPopOrder(t *testing.T, step int, e *Entry, in map[*Entry]bool, seq map[*Entry]int, now time.Time, aging time.Duration) {
	t.Helper()
	top, oldest := e.Priority, map[int]time.Time{}
	for x := range in {
		top = max(top, x.Priority)
		if o, ok := oldest[x.Priority]; !ok || x.Enqueued.Before(o) {
			oldest[x.Priority] = x.Enqueued
		}
		if x != e && x.Priority == e.Priority && x.Tenant == e.Tenant && seq[x] < seq[e] {
			t.Fatalf("step %d: popped %s's entry %d before its older entry %d", step, e.Tenant, seq[e], seq[x])
		}
	}
	best, bestEff := top, math.Inf(-1)
	for p, o := range oldest {
		eff := float64(p) + float64(now.Sub(o))/float64(aging)
		if eff > bestEff || eff == bestEff && p > best {
			best, bestEff = p, eff
		}
	}
	if e.Priority != top && e.Priority != best {
		t.Fatalf("step %d: popped priority %d; the top band is %d and aging's %d", step, e.Priority, top, best)
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "3": 3, "-2": -2, "+4": 4, "99": MaxPriority, "-99999": MinPriority} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-", "1.5", "x", "123456789", " 1"} {
		if _, err := ParsePriority(in); err == nil {
			t.Errorf("ParsePriority(%q) accepted", in)
		}
	}
	if FromVLLMPriority(-5) != 5 || FromVLLMPriority(1<<62) != MinPriority || FromVLLMPriority(-1<<62) != MaxPriority {
		t.Error("FromVLLMPriority")
	}
}

func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{"0", "-10", "+3", "abc", "99999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePriority(s)
		if err == nil && (p < MinPriority || p > MaxPriority) {
			t.Fatalf("%q gave %d", s, p)
		}
	})
}

// TestQueueAgedShareBoundsInversion: with both bands backlogged and the low band aged far past
// the high one, the low band gets AgedShare of the dispatches — never starved, and the high band
// loses no more than that.
func TestQueueAgedShareBoundsInversion(t *testing.T) {
	q := NewQueue(Config{MaxRequests: 10000, Timeout: time.Hour, Aging: time.Millisecond, AgedShare: 0.2})
	for i := 0; i < 1000; i++ {
		_ = q.Push(ent("low", 0), t0)
	}
	now := t0.Add(time.Minute)
	low := 0
	for i := 0; i < 500; i++ {
		_ = q.Push(ent("high", 5), now)
		if q.Pop(now).Tenant == "low" {
			low++
		}
	}
	if share := float64(low) / 500; share < 0.15 || share > 0.21 {
		t.Errorf("the aged low band got %.3f of the dispatches, want about 0.2", share)
	}
}

// TestQueueUnservedChargesNothing: requests that leave unserved (timeouts, cancels) do not count
// against their tenant's share.
func TestQueueUnservedChargesNothing(t *testing.T) {
	q := NewQueue(Config{MaxRequests: 10000, Timeout: time.Hour})
	var as []*Entry
	for i := 0; i < 200; i++ {
		a := &Entry{Tenant: "a", Cost: 10}
		_ = q.Push(a, t0)
		as = append(as, a)
		_ = q.Push(&Entry{Tenant: "b", Cost: 10}, t0)
	}
	for _, a := range as[:100] {
		q.Remove(a) // a's oldest time out
	}
	na := 0
	for i := 0; i < 100; i++ {
		if q.Pop(t0).Tenant == "a" {
			na++
		}
	}
	if na < 48 || na > 52 {
		t.Errorf("a got %d of 100 dispatches after its timeouts, want about 50", na)
	}
}
