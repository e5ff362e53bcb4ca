package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRoutingTextReachesPastASharedOpening: the routing text is the first past bytes where the
// tree holds them for one worker at most (a conversation's history, an opening only one worker
// was sent), and past bytes beyond the opening, rounded down to 1 KiB, where it holds all of them
// for two; never more than MaxRoutingText, never cut inside a character; a salt's mark is not
// counted; a policy without a tree cuts at past.
func TestRoutingTextReachesPastASharedOpening(t *testing.T) {
	const past = 1024
	open := strings.Repeat("the shared system prompt ", 120) // 3,000 bytes, longer than past
	session := func(s string) string { return open + strings.Repeat(s, 3000) }
	ws := testWorkers(t, 2)
	p := newCostPolicy(t, "cache_aware_hash", nil, newFakeLoads())
	defer p.Close()
	long := session("x")
	if got := RoutingText(p, long, false, past); got != long[:past] {
		t.Fatalf("empty tree: %d bytes, want the first %d", len(got), past)
	}
	// One worker holds the opening: nothing tells it is shared.
	p.Record(&Request{Text: RoutingText(p, session("a"), false, past)}, ws[0])
	if got := RoutingText(p, long, false, past); len(got) != past || SharedThrough(p, long[:past]) {
		t.Fatalf("opening on one worker: %d bytes (shared through %v), want %d", len(got), SharedThrough(p, long[:past]), past)
	}
	// A second worker holds it: the routing text reaches past bytes past it, the opening rounded
	// down to 1 KiB. The records are cut at past, so the tree knows 1 KiB of the opening shared,
	// and the next prompts reach 2 KiB; those recorded on both show the whole opening shared.
	p.Record(&Request{Text: RoutingText(p, session("b"), false, past)}, ws[1])
	if got := RoutingText(p, long, false, past); len(got) != 2*past || !SharedThrough(p, long[:past]) {
		t.Fatalf("1 KiB shared: %d bytes (shared through %v), want %d", len(got), SharedThrough(p, long[:past]), 2*past)
	}
	for i, s := range []string{"c", "d", "e", "f"} {
		p.Record(&Request{Text: RoutingText(p, session(s), false, past)}, ws[i%2])
	}
	want := len(open) - len(open)%openingGrain + past
	got := RoutingText(p, long, false, past)
	if len(got) != want || got != long[:want] {
		t.Fatalf("the opening shared: %d bytes, want %d", len(got), want)
	}
	// The opening of a conversation held by two workers counts as well, up to the cap.
	huge := open + strings.Repeat("y", 10*past)
	for _, w := range ws {
		p.Record(&Request{Text: huge[:MaxRoutingText(past)]}, w)
	}
	if got := RoutingText(p, huge, false, past); len(got) != MaxRoutingText(past) {
		t.Fatalf("an opening past the cap: %d bytes, want %d", len(got), MaxRoutingText(past))
	}
	// A salted text: the mark opens it and is not counted.
	if got := RoutingText(p, SaltedText(long, 7), true, past); len(got) != SaltMarkLen+past {
		t.Fatalf("salted, nothing shared: %d bytes, want %d", len(got), SaltMarkLen+past)
	}
	// Never inside a character.
	multi := open + strings.Repeat("é", 3000)
	if got := RoutingText(p, multi, false, past); !utf8.ValidString(got) || len(got) < want-1 || len(got) > want {
		t.Fatalf("two-byte characters: %d bytes (valid %v), want %d or one less", len(got), utf8.ValidString(got), want)
	}
	// least_load keeps no tree: the first past bytes.
	ll := newCostPolicy(t, "least_load", nil, newFakeLoads())
	if got := RoutingText(ll, long, false, past); len(got) != past {
		t.Fatalf("least_load: %d bytes, want %d", len(got), past)
	}
}

// TestSessionsPastASharedOpeningGoApart: every prompt opens with the same text, longer than
// past; two sessions served on two workers each go back to their own worker for their next turn,
// which a routing text of the opening alone cannot tell apart (the tree would place both turns
// on both workers). Policy-level: the gateway's test is TestASharedOpeningLongerThanTheRoutingText.
func TestSessionsPastASharedOpeningGoApart(t *testing.T) {
	const past = 1024
	open := strings.Repeat("the shared system prompt ", 120)
	ws := testWorkers(t, 2)
	p := newCostPolicy(t, "cache_aware_hash", nil, newFakeLoads())
	defer p.Close()
	turn1 := []string{open + strings.Repeat("session zero ", 200), open + strings.Repeat("session one ", 200)}
	// Each session's first turns on its own worker: the first records are cut at past, all
	// opening, and show that much of it shared; the next reach past further, until the whole
	// opening shows shared and the routing text reaches past it into each session.
	for range 3 {
		for i, text := range turn1 {
			p.Record(&Request{Text: RoutingText(p, text, false, past), PromptBytes: len(text)}, ws[i])
		}
	}
	for i, text := range turn1 {
		next := text + " and the next question"
		req := &Request{Text: RoutingText(p, next, false, past), PromptBytes: len(next)}
		if w := Choose(context.Background(), p, ws, req); w != ws[i] {
			t.Errorf("session %d's next turn went to %s, want %s (routing text %d bytes)", i, w.ID, ws[i].ID, len(req.Text))
		}
		if req.Decision.Chosen.Cached < req.Decision.Chosen.Prompt {
			t.Errorf("session %d: predicted %.0f of %.0f tokens cached on its own worker, want all", i, req.Decision.Chosen.Cached, req.Decision.Chosen.Prompt)
		}
	}
	// The opening alone (a fixed routing text) places each next turn on both workers alike.
	next := turn1[1] + " and the next question"
	req := &Request{Text: next[:past], PromptBytes: len(next)}
	Choose(context.Background(), p, ws, req)
	if c, r := req.Decision.Chosen.Cached, req.Decision.RunnerUp.Cached; c != r {
		t.Errorf("the opening alone: %.0f tokens predicted on the chosen worker, %.0f on the other; want them equal", c, r)
	}
}

// BenchmarkRoutingText times the cut alone, on the tree and prompts of
// BenchmarkDecisionWithMonitor (a shared 2 KB opening, shorter than the 8 KiB routing text: the
// walk stops at the end of the opening) and on prompts whose 12 KB opening the tree holds for
// two workers (the walk reads all of it).
func BenchmarkRoutingText(b *testing.B) {
	const past = 8192
	ws := testWorkers(b, 2)
	for _, more := range []int{0, 10240} { // on top of mooncakeTexts' 2 KB opening
		b.Run(fmt.Sprintf("opening=%d", 2048+more), func(b *testing.B) {
			texts := mooncakeTexts()
			for i := range texts {
				texts[i] = texts[i][:2048] + strings.Repeat("o", more) + texts[i][2048:] + texts[(i+1)%len(texts)]
			}
			p := newCostPolicy(b, "cache_aware_hash", nil, newFakeLoads())
			defer p.Close()
			for i := range texts {
				for range 3 { // until the opening shows shared and the cut settles
					p.Record(&Request{Text: RoutingText(p, texts[i], false, past)}, ws[i%2])
				}
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				RoutingText(p, texts[i%len(texts)], false, past)
				i++
			}
		})
	}
}
