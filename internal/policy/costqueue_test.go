package policy

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestQueuedSendsArithmetic: two engines of 10 running requests each (the fleet generating 1,000
// tokens a second per engine: D is 10 ms, 11 ms with one more request), prefill at 8,000 tokens
// a second (the default μ), reported with Q queued 500 ms before an 800-token prompt is sent to
// one of them; 10 ms later the same prompt is decided again. With nothing queued (Q = 0) S takes
// off the 4,080 tokens the engine could have prefilled since the report, so the first prompt counts
// as prefilled the instant it was sent and the second follows it (the engines tie within ε); U
// drains it only from the instant it came, 800 − 80 = 720 tokens, which S is then (90 ms), and
// the second prompt goes to the other engine. With 8,000 tokens queued at the report the queue
// never ran empty, and U is S: 800 tokens either way, and the second prompt goes to the other
// engine with the term or without. A second on, the engine has prefilled all
// of it, and U is 0.
func TestQueuedSendsArithmetic(t *testing.T) {
	polled := time.Unix(1000, 0)
	for _, tt := range []struct {
		on       bool
		queued   int64   // Q at the report, tokens
		same     bool    // the second prompt follows the first
		wantU    float64 // U of the first engine at the second decision, tokens
		wantSent float64 // S of it then
	}{
		{false, 0, true, 0, 0},
		{true, 0, false, 720, 720},
		{true, 8000, false, 800, 800},
		{false, 8000, false, 0, 800},
	} {
		t.Run(fmt.Sprint(tt.on, tt.queued), func(t *testing.T) {
			ws, reports := tenRunning(t, polled, tt.queued, 1)
			p := newCostPolicy(t, "least_load", nil, reports)
			p.sc.cfg.QueueSends = tt.on
			pick := samePrompt(t, p, ws, "the same prompt", 800*4)
			costClock.advance(500 * time.Millisecond)
			first, onFirst := pickedTwice(t, pick, 10*time.Millisecond, tt.same)
			if onFirst.Worker != first || onFirst.Rate != 8000 || math.Abs(onFirst.Decode-0.011) > 1e-12 {
				t.Fatalf("terms of the first engine %+v, want μ 8000, D 11 ms", onFirst)
			}
			if math.Abs(onFirst.Unprefilled-tt.wantU) > 1e-9 || math.Abs(onFirst.Sent-tt.wantSent) > 1e-9 {
				t.Fatalf("U %v, S %v of the first engine, want %v and %v (%+v)", onFirst.Unprefilled, onFirst.Sent, tt.wantU, tt.wantSent, onFirst)
			}
			if math.Abs(onFirst.Cost-onFirst.Formula()) > 1e-12 {
				t.Fatalf("cost %v is not the formula of the terms %v", onFirst.Cost, onFirst.Formula())
			}
			if hasU := strings.Contains(onFirst.String(), fmt.Sprintf(" u=%.0f", tt.wantU)); hasU != (tt.wantU > 0) {
				t.Fatalf("audit terms %q: u= shown %v, want %v", onFirst.String(), hasU, tt.wantU > 0)
			}
			costClock.advance(time.Second) // the engine has prefilled everything
			_, d := pick()
			if d.Chosen.Unprefilled != 0 || d.RunnerUp.Unprefilled != 0 {
				t.Fatalf("U once the engine could prefill everything: %v and %v, want 0", d.Chosen.Unprefilled, d.RunnerUp.Unprefilled)
			}
		})
	}
}

// TestSendQueueDrainsOnlyWhatCame: the queue drains at μ only while it holds work. 800 tokens
// sent 500 ms after an empty report are all there; 400 more 50 ms later join the 400 left
// (800); 50 ms on, 400 are left; past that, none, never less.
func TestSendQueueDrainsOnlyWhatCame(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := sendQueue{polled: t0, at: t0}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	q.tokens, q.at = q.backlog(at(500), 8000)+800, at(500)
	if b := q.backlog(at(500), 8000); b != 800 {
		t.Fatalf("backlog at the send %v, want 800", b)
	}
	q.tokens, q.at = q.backlog(at(550), 8000)+400, at(550)
	for _, c := range []struct {
		ms   int
		want float64
	}{{550, 800}, {600, 400}, {700, 0}, {5000, 0}} {
		if b := q.backlog(at(c.ms), 8000); math.Abs(b-c.want) > 1e-9 {
			t.Fatalf("backlog at %d ms %v, want %v", c.ms, b, c.want)
		}
	}
}

// queuePeers is a sync plane whose peers sent one 800-token prompt to one worker since its
// report.
type queuePeers struct{ herdPeers }

func (p queuePeers) SentSinceAll(ws []string, _ []time.Time, tok, req []float64) {
	for i, w := range ws {
		tok[i], req[i] = 0, 0
		if w == p.to {
			tok[i], req[i] = 800, 1
		}
	}
}

// TestQueuedSendsTakeThePeers: with replica sync, what the peers sent since the report joins the
// queue when this replica hears of it. Reported with nothing queued 500 ms before, S takes the
// peers' 800 tokens as prefilled already (S = 0); U holds them from this decision on (800), and the
// pick goes to the other engine; 10 ms later they are taken once, not again: 720.
func TestQueuedSendsTakeThePeers(t *testing.T) {
	polled := time.Unix(1000, 0)
	ws, reports := tenRunning(t, polled, 0, 1)
	costClock.t = polled
	cfg := DefaultConfig()
	cfg.Loads, cfg.NoBackground, cfg.Now, cfg.Peers = reports, true, costClock.now, queuePeers{herdPeers{to: ws[0].ID}}
	cfg.Cost.QueueSends = true
	pol, err := New("least_load", cfg)
	if err != nil {
		t.Fatal(err)
	}
	costClock.advance(500 * time.Millisecond)
	for _, want := range []float64{800, 720} {
		req := &Request{Model: "m", Text: "a prompt", PromptBytes: 4}
		if got := Choose(context.Background(), pol, ws, req); got != ws[1] {
			t.Fatalf("picked %s, want the engine the peers did not send to (%+v)", got.ID, req.Decision)
		}
		if d := req.Decision.RunnerUp; d.Worker != ws[0].ID || math.Abs(d.Unprefilled-want) > 1e-9 || math.Abs(d.Sent-want) > 1e-9 {
			t.Fatalf("terms of the peers' engine %+v, want U = S = %v", d, want)
		}
		costClock.advance(10 * time.Millisecond)
	}
}
