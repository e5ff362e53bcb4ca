package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestPreciseScoresADriftingWorkerFromTheTree: worker 0's events index says its engine holds
// every prompt while its answers report nothing cached (an engine that restarted under the
// same publisher). After a few such answers the worker is drifting (counted once), and its Ĉ
// comes from the tree, which holds none of a new prompt: no decision predicts a hit any more.
// Once the index agrees with the answers again (a resync emptied it), the worker comes back.
func TestPreciseScoresADriftingWorkerFromTheTree(t *testing.T) {
	kv := &fakeKV{held: map[string]int{}}
	ws := cahWorkers(t, 2)
	p := newCostPolicy(t, "precise", kv, cahLoads{})
	kv.held[ws[0].ID] = 1 << 20
	send := func(i int) *Request {
		req := &Request{Model: "m", Text: fmt.Sprintf("prompt number %d, ", i) + strings.Repeat("long enough to hold several blocks of tokens ", 8)}
		Prepare(context.Background(), p, ws, req)
		w := Choose(context.Background(), p, ws, req)
		p.Learn(req, Answer{Worker: w.ID, PromptTokens: len(req.Text), CachedTokens: 0})
		return req
	}
	for i := range driftMinAnswers {
		if req := send(i); req.Decision.Worker != ws[0].ID || req.Decision.Predicted < 0.9 {
			t.Fatalf("prompt %d before the drift: to %s predicted %.2f; want worker 0, whose index claims it all", i, req.Decision.Worker, req.Decision.Predicted)
		}
	}
	if d := p.WorkerDrift(ws[0].ID); !d.Drifting || d.Count != 1 {
		t.Fatalf("worker 0 after %d answers that disagree with its index: %+v, want drifting, counted once", driftMinAnswers, d)
	}
	for i := range 8 {
		if req := send(100 + i); req.Decision.Predicted > 0.1 {
			t.Fatalf("a new prompt while worker 0 drifts: to %s predicted %.2f cached; want the tree's 0", req.Decision.Worker, req.Decision.Predicted)
		}
	}
	kv.held[ws[0].ID] = 0 // resynchronized: the index now says what the answers say
	for i := range 60 {
		send(200 + i)
		if !p.WorkerDrift(ws[0].ID).Drifting {
			break
		}
	}
	if d := p.WorkerDrift(ws[0].ID); d.Drifting || d.Count != 1 {
		t.Fatalf("worker 0 once its index agrees again: %+v, want not drifting, counted once", d)
	}
	if d := p.WorkerDrift(ws[1].ID); d.Drifting || d.Count != 0 {
		t.Fatalf("worker 1, whose index always agreed: %+v", d)
	}
	p.Forget(ws[0].ID)
	if _, ok := p.Drifts()[ws[0].ID]; ok {
		t.Fatal("Forget kept the worker's drift state")
	}
}
