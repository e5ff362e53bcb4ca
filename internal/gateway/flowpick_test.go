package gateway

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/loadmon"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// TestFlowChooseIsOneStep: a first attempt's pick runs with the gate's picking lock held (so no
// other first attempt can judge the same free slot meanwhile) while the request still counts
// as pending; once choose returns, its send is in the gate's estimate of the worker and the
// pending hold is gone, so it was counted one way or the other throughout. A retry picks
// without the lock.
func TestFlowChooseIsOneStep(t *testing.T) {
	w, err := worker.New(worker.Spec{URL: "http://127.0.0.1:1", Models: []string{"m"}}, worker.BreakerConfig{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	g := &flowGate{engines: map[*worker.Worker]*loadmon.Estimate{}}
	mf := &modelFlow{model: "m"}
	mf.pending.Add(1)
	tk := &flowTicket{g: g, mf: mf, kv: 1000}
	req := &policy.Request{Model: "m"}
	got := tk.choose(true, req, func() *worker.Worker {
		if g.picking.TryLock() {
			t.Error("a first attempt picked without the picking lock")
			g.picking.Unlock()
		}
		if n := mf.pending.Load(); n != 1 {
			t.Errorf("pending %d during the pick, want 1 (the hold is released only after the send is recorded)", n)
		}
		if req.Startable == nil {
			t.Error("a first attempt picked without the startable judgement")
		}
		return w
	})
	if got != w {
		t.Fatalf("choose returned %v", got)
	}
	if n := mf.pending.Load(); n != 0 {
		t.Fatalf("pending %d after the pick, want 0", n)
	}
	cfg := loadmon.DefaultEstimateConfig()
	if e := g.engines[w]; e == nil {
		t.Fatal("the send is not in the gate's estimate of the worker")
	} else if _, sent := e.Prefill(time.Time{}, 1, &cfg); sent != 1000 {
		t.Fatalf("the gate's estimate holds %v tokens sent, want the request's 1000", sent)
	}
	if !g.picking.TryLock() {
		t.Fatal("the picking lock is still held after the pick")
	}
	g.picking.Unlock()
	// A retry (not the first attempt) picks without the lock: its worker already holds it.
	tk.choose(false, req, func() *worker.Worker {
		if !g.picking.TryLock() {
			t.Error("a retry waited for the picking lock")
		} else {
			g.picking.Unlock()
		}
		return w
	})
}
