package engine

import (
	"container/heap"
	"slices"
	"time"
)

// startStep composes the step (or run of identical decode steps) that starts at t, or leaves
// the engine idle when there is nothing to do.
func (e *Engine) startStep(t time.Duration) {
	e.cache.at = t
	clear(e.plan)
	clear(e.decoders)
	e.plan, e.decoders = e.plan[:0], e.decoders[:0]
	e.spare = append(e.spare, e.retired...)
	clear(e.retired)
	e.retired = e.retired[:0]
	e.growDecoders(1)
	e.admit(t)

	budget, prefill := e.cfg.PrefillChunk, 0
	for _, r := range e.running {
		if r.computed < r.target {
			if budget > 0 {
				n := min(budget, r.target-r.computed)
				if !r.began {
					r.began, r.scheduled = true, t // its first chunk: its prefill starts
				}
				e.plan = append(e.plan, chunk{r, n})
				budget -= n
				prefill += n
			}
			continue
		}
		e.decoders = append(e.decoders, r)
	}
	if prefill == 0 && len(e.decoders) == 0 {
		return
	}
	// The weights of the adapters this step admitted load before it runs (lora.go).
	stall := e.lora.stall
	e.lora.stall = 0
	steps := 1
	if prefill == 0 {
		steps = e.runLength()
	}
	d := e.cfg.DecodeBase + time.Duration(len(e.decoders))*e.cfg.DecodePerReq
	if p := time.Duration(float64(prefill) / e.cfg.PrefillTPS * float64(time.Second)); p > d {
		if len(e.decoders) > 0 {
			// The step's prefill outlasts its decode: every decoding request waits for it.
			e.stats.stall += p - d
		}
		d = p
	}
	if stall > 0 {
		steps, d = 1, d+stall
	}
	if prefill > 0 {
		e.stats.prefillBusy += max(d, 1)
		e.stats.prefillBusyTokens += int64(prefill)
	}
	e.busy, e.stepStart, e.stepDur, e.steps, e.done = true, t, max(d, 1), steps, 0
}

// growDecoders makes every decoding request hold the KV blocks for k more tokens. When the cache
// cannot, it preempts the most recently admitted running request (possibly the one growing) and
// retries, as vLLM does.
func (e *Engine) growDecoders(k int) {
	bs := e.cfg.BlockSize
	for i := 0; i < len(e.running); i++ {
		r := e.running[i]
		if r.computed < r.target {
			continue
		}
		need := ceilDiv(r.promptLen+r.generated+k, bs) - r.held()
		for need > 0 && !e.cache.alloc(need) {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			if victim == r {
				need = 0
				i--
			}
		}
		if need > 0 {
			r.priv += need
		}
	}
}

// runLength returns how many identical decode-only steps can run before anything changes: up to
// the first request's last token, and only as long as the cache can hold the new tokens, whose
// blocks it then allocates.
func (e *Engine) runLength() int {
	k := e.decoders[0].maxTokens - e.decoders[0].generated
	for _, r := range e.decoders[1:] {
		k = min(k, r.maxTokens-r.generated)
	}
	if k <= 1 {
		return 1
	}
	bs, need := e.cfg.BlockSize, 0
	for _, r := range e.decoders {
		need += max(0, ceilDiv(r.promptLen+r.generated+k, bs)-r.held())
	}
	if need > e.cache.supply() {
		return 1
	}
	for _, r := range e.decoders {
		if n := ceilDiv(r.promptLen+r.generated+k, bs) - r.held(); n > 0 {
			e.cache.alloc(n)
			r.priv += n
		}
	}
	return k
}

// admit moves waiting requests to running, first-in-first-out, while there is room.
func (e *Engine) admit(t time.Duration) {
	bs := e.cfg.BlockSize
	for i := e.wh; i < len(e.waiting) && len(e.running) < e.cfg.MaxRunning; {
		r := e.waiting[i]
		if !e.loraFits(r) {
			i++ // every slot is held by other adapters: the requests behind it may fit
			continue
		}
		var evictable int
		r.pinned, evictable = e.cache.lookup(r.keys, r.pinned[:0])
		m := len(r.pinned)
		need := ceilDiv(r.target, bs) - m
		if e.cfg.Timing == TimingPerSlot {
			// Reserve the output's blocks too: a slot never grows, so it never preempts.
			need = ceilDiv(r.target+r.maxTokens-r.generated, bs) - m
		}
		if need > e.cache.supply()-evictable {
			r.pinned = r.pinned[:0]
			return
		}
		for _, id := range r.pinned {
			e.cache.ref(id)
		}
		e.cache.alloc(need)
		r.priv = need
		r.computed = min(m*bs, r.target-1)
		if i == e.wh {
			e.waiting[e.wh] = nil
			e.wh++
			i++
		} else {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
		if e.wh == len(e.waiting) {
			e.waiting, e.wh, i = e.waiting[:0], 0, 0
		}
		if r.loraLoad = e.loraAcquire(r, t); r.loraLoad {
			e.lora.stall += e.cfg.LoraLoad
		}
		e.uncached -= int64(r.uncached)
		r.state = running
		r.seq = e.seq
		e.seq++
		e.running = append(e.running, r)
		if r.admitted {
			continue
		}
		r.admitted = true
		r.cached = r.computed
		e.stats.admit(t, e.cfg.StatsWindow, r.cached, r.promptLen)
		e.pending = append(e.pending, Event{Kind: Admitted, ID: r.id, At: t,
			PromptTokens: r.promptLen, CachedTokens: r.cached})
	}
}

// apply completes s steps of the current run, the last of which ends at t.
func (e *Engine) apply(s int, t time.Duration) {
	e.cache.at = t
	gen := 0
	for _, c := range e.plan {
		r := c.r
		if r.state != running {
			continue
		}
		r.computed += c.n
		e.publish(r)
		if r.computed < r.target {
			continue
		}
		r.generated++
		gen++
		if !r.started {
			r.started, r.firstAt = true, t
			e.stats.prefilled(t-r.scheduled, r.promptLen-r.cached)
			e.pending = append(e.pending, Event{Kind: FirstToken, ID: r.id, At: t, Tokens: 1, TTFT: t - r.arrival})
		} else if e.cfg.EmitTokens {
			e.pending = append(e.pending, Event{Kind: Tokens, ID: r.id, At: t, Tokens: 1})
		}
		e.maybeFinish(r, t)
	}
	for _, r := range e.decoders {
		if r.state != running {
			continue
		}
		r.generated += s
		gen += s
		if e.cfg.EmitTokens {
			e.pending = append(e.pending, Event{Kind: Tokens, ID: r.id, At: t, Tokens: s})
		}
		e.maybeFinish(r, t)
	}
	e.stats.generate(t, e.cfg.StatsWindow, gen)
}

// publish enters the request's newly computed full prompt blocks into the prefix cache.
func (e *Engine) publish(r *req) {
	full := min(r.computed/e.cfg.BlockSize, len(r.keys))
	for j := len(r.pinned); j < full; j++ {
		id, fresh := e.cache.publish(r.keys[j])
		r.pinned = append(r.pinned, id)
		r.priv--
		if fresh && e.cache.obs != nil {
			e.stored(r, j)
		}
	}
}

func (e *Engine) maybeFinish(r *req, t time.Duration) {
	if r.generated < r.maxTokens {
		return
	}
	e.removeRunning(r)
	e.releaseKV(r)
	e.retire(r)
	e.stats.finished++
	e.pending = append(e.pending, Event{Kind: Finished, ID: r.id, At: t, TTFT: r.firstAt - r.arrival,
		PromptTokens: r.promptLen, CachedTokens: r.cached, CompletionTokens: r.generated})
}

// preempt sends a running request back to the head of the queue; it will recompute its prompt
// and the tokens it generated so far (what is still cached is not recomputed).
func (e *Engine) preempt(r *req) {
	e.removeRunning(r)
	e.releaseKV(r)
	r.computed = 0
	r.target = r.promptLen + r.generated
	e.enqueue(r, true)
	e.stats.preempted++
}

// releaseKV frees the request's private blocks and unpins its cached ones, the last block first
// so that eviction takes a prompt's tail before its head.
func (e *Engine) releaseKV(r *req) {
	for i := len(r.pinned) - 1; i >= 0; i-- {
		e.cache.unpin(r.pinned[i])
	}
	r.pinned = r.pinned[:0]
	e.cache.release(r.priv)
	r.priv = 0
	e.loraRelease(r)
}

func (e *Engine) removeRunning(r *req) {
	if r.slot >= 0 {
		heap.Remove(&e.slots, r.slot)
	}
	for i, x := range e.running {
		if x == r {
			copy(e.running[i:], e.running[i+1:])
			e.running[len(e.running)-1] = nil
			e.running = e.running[:len(e.running)-1]
			return
		}
	}
}
