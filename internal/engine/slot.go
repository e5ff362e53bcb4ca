package engine

import (
	"container/heap"
	"time"
)

// The per-slot timing model (TimingPerSlot): every running request has its own clock, kept as
// the time of its next event (due) in a min-heap, so that the next event of the engine is the
// heap's top and applying one costs O(log running).

// advanceSlots is advance under TimingPerSlot: it applies, in time order, every request event
// due by now and every admission pending before now (at now too when inclusive is set, so that
// a Submit at now can still be admitted with the others submitted at now).
func (e *Engine) advanceSlots(now time.Duration, inclusive bool) {
	now = max(now, e.now)
	for {
		var r *req
		if len(e.slots) > 0 && e.slots[0].due <= now {
			r = e.slots[0]
		}
		// A request event and an admission at the same time: the event first, so that a slot
		// freed at t is taken at t.
		if e.startQueue && (e.startAt < now || inclusive && e.startAt == now) && (r == nil || e.startAt < r.due) {
			e.startQueue = false
			e.admitSlots(e.startAt)
			continue
		}
		if r == nil {
			break
		}
		e.slotEvent(r)
	}
	e.now = now
}

// admitSlots admits waiting requests at t while slots and KV are free, and starts each one's
// prefill clock.
func (e *Engine) admitSlots(t time.Duration) {
	e.cache.at = t
	first := len(e.running)
	e.admit(t)
	e.lora.stall = 0 // each request pays its own adapter's load (below)
	for i := first; i < len(e.running); i++ {
		r := e.running[i]
		f := e.loadFactor(i + 1)
		p := e.cfg.PrefillOverhead + time.Duration(float64(r.target-r.computed)/e.cfg.PrefillTPS*float64(time.Second))
		if r.loraLoad {
			p += e.cfg.LoraLoad
		}
		r.prefillFrom, r.prefillDur = t, max(time.Duration(float64(p)*f), 1)
		if !r.began {
			r.began, r.scheduled = true, t
		}
		r.due = t + r.prefillDur
		heap.Push(&e.slots, r)
	}
}

// loadFactor is the slowdown with running requests in the slots (Config.LoadFactor).
func (e *Engine) loadFactor(running int) float64 {
	if e.cfg.MaxRunning <= 1 || e.cfg.LoadFactor == 1 {
		return 1
	}
	return 1 + (e.cfg.LoadFactor-1)*float64(running-1)/float64(e.cfg.MaxRunning-1)
}

// slotEvent applies r's event, due now: the end of its prefill (its first token), or its next
// token (EmitTokens) or the rest of its tokens (fast mode).
func (e *Engine) slotEvent(r *req) {
	t := r.due
	e.cache.at = t
	if r.computed < r.target {
		r.computed = r.target
		e.publish(r)
		r.generated = 1
		r.started, r.firstAt = true, t
		e.stats.prefilled(t-r.scheduled, r.promptLen-r.cached)
		e.pending = append(e.pending, Event{Kind: FirstToken, ID: r.id, At: t, Tokens: 1, TTFT: t - r.arrival})
		e.stats.generate(t, e.cfg.StatsWindow, 1)
		r.itl = time.Duration(float64(e.cfg.DecodeBase) * e.loadFactor(len(e.running)))
	} else {
		n := 1
		if !e.cfg.EmitTokens {
			n = r.maxTokens - r.generated
		}
		r.generated += n
		e.stats.generate(t, e.cfg.StatsWindow, n)
		if e.cfg.EmitTokens {
			e.pending = append(e.pending, Event{Kind: Tokens, ID: r.id, At: t, Tokens: 1})
		}
	}
	if r.generated >= r.maxTokens {
		e.maybeFinish(r, t) // takes r off the heap
		if e.wh < len(e.waiting) && (!e.startQueue || e.startAt > t) {
			e.startQueue, e.startAt = true, t
		}
		return
	}
	if e.cfg.EmitTokens {
		r.due = t + r.itl
	} else {
		r.due = t + time.Duration(r.maxTokens-r.generated)*r.itl
	}
	heap.Fix(&e.slots, r.slot)
}

// nextSlotEvent is NextEvent under TimingPerSlot: the earlier of the first request event and a
// pending admission.
func (e *Engine) nextSlotEvent() (time.Duration, bool) {
	switch {
	case len(e.slots) > 0 && e.startQueue:
		return min(e.slots[0].due, e.startAt), true
	case len(e.slots) > 0:
		return e.slots[0].due, true
	case e.startQueue:
		return e.startAt, true
	}
	return 0, false
}

// slotPrefillLeft is how many of r's uncached prompt tokens are still to prefill at now, in
// proportion to the time left of its prefill.
func (e *Engine) slotPrefillLeft(r *req) int64 {
	if r.computed >= r.target || r.prefillDur <= 0 {
		return int64(max(r.target-r.computed, 0))
	}
	left := float64(r.due-e.now) / float64(r.prefillDur)
	return int64(float64(r.target-r.computed)*min(max(left, 0), 1) + 0.5)
}

// slotHeap orders running requests by their next event, then by admission order, so that ties
// are applied deterministically. It implements heap.Interface.
type slotHeap []*req

func (h slotHeap) Len() int { return len(h) }

func (h slotHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].seq < h[j].seq
}

func (h slotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}

func (h *slotHeap) Push(x any) {
	r := x.(*req)
	r.slot = len(*h)
	*h = append(*h, r)
}

func (h *slotHeap) Pop() any {
	old := *h
	n := len(old)
	r := old[n-1]
	old[n-1] = nil
	r.slot = -1
	*h = old[:n-1]
	return r
}
