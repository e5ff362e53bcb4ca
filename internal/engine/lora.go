package engine

import (
	"slices"
	"time"
)

// The LoRA slot model (Config.MaxLoras > 0), vLLM's: an engine holds at most MaxLoras adapters
// in its GPU slots at once. A request for an adapter in a slot runs as any other; one for an
// adapter not in a slot takes a free slot, or the least recently used slot no running request
// holds, and the step that admits it (TimingBatched) or its own prefill (TimingPerSlot) lasts
// Config.LoraLoad longer while the weights load. When every slot is held by running requests of
// other adapters, the request waits in the queue, and the requests behind it that fit are
// admitted past it, as vLLM's scheduler skips a request whose adapter cannot be scheduled.
//
// An adapter's KV blocks are its own: a prompt's block keys are chained from a seed of its
// adapter's name, so an adapter never hits the base model's cache nor another adapter's.

// DefaultLoraLoad is Config.LoraLoad's default: the time to load one adapter into a slot.
const DefaultLoraLoad = 50 * time.Millisecond

// loraSlots is the engine's adapter slots. Slot i holds names[i], held by users[i] running
// requests, last admitted at used[i].
type loraSlots struct {
	names []string
	users []int
	used  []time.Duration
	// stall is the load time the step being composed pays (TimingBatched).
	stall time.Duration
	// loads counts the adapters loaded since start.
	loads int64
}

// loraOn reports whether the slot model applies to r.
func (e *Engine) loraOn(r *req) bool { return e.cfg.MaxLoras > 0 && r.adapter != "" }

// loraFits reports whether r can be admitted at t as far as adapter slots go: its adapter is in a
// slot, or a slot is free or idle.
func (e *Engine) loraFits(r *req) bool {
	if !e.loraOn(r) {
		return true
	}
	s := &e.lora
	if slices.Contains(s.names, r.adapter) || len(s.names) < e.cfg.MaxLoras {
		return true
	}
	return slices.Contains(s.users, 0)
}

// loraAcquire gives r its adapter's slot at t (loraFits said it can), loading the adapter into
// a free or the least recently used idle slot when it is in none, and reports whether it
// loaded.
func (e *Engine) loraAcquire(r *req, t time.Duration) (loaded bool) {
	r.loraSlot = -1
	if !e.loraOn(r) {
		return false
	}
	s := &e.lora
	i := slices.Index(s.names, r.adapter)
	if i < 0 {
		loaded = true
		s.loads++
		if len(s.names) < e.cfg.MaxLoras {
			s.names, s.users, s.used = append(s.names, r.adapter), append(s.users, 0), append(s.used, t)
			i = len(s.names) - 1
		} else {
			for j := range s.names {
				if s.users[j] == 0 && (i < 0 || s.used[j] < s.used[i]) {
					i = j
				}
			}
			s.names[i] = r.adapter
		}
	}
	s.users[i]++
	s.used[i] = t
	r.loraSlot = i
	return loaded
}

// loraRelease gives back r's slot (it finished, was aborted or preempted).
func (e *Engine) loraRelease(r *req) {
	if r.loraSlot >= 0 {
		e.lora.users[r.loraSlot]--
		r.loraSlot = -1
	}
}

// AdapterObserver is a CacheObserver that is also told the LoRA adapter of each block of an
// adapter's prompt, just before BlockStored reports it (vLLM's BlockStored carries the
// adapter's id and name); a base model's block is reported without the call.
type AdapterObserver interface {
	StoredAdapter(adapter string)
}

// loraKeys re-seeds a prompt's block keys with its adapter's name, so that they match only the
// same adapter's blocks.
func loraKeys(keys []uint64, adapter string) {
	if adapter == "" {
		return
	}
	seed := uint64(0xcbf29ce484222325)
	for i := 0; i < len(adapter); i++ {
		seed = (seed ^ uint64(adapter[i])) * 0x100000001b3
	}
	for i := range keys {
		keys[i] = chainKey(keys[i], seed)
	}
}

// LoraState is what an engine reports of its adapters, vLLM's lora_requests_info: the adapters of
// its running and of its waiting requests (each sorted, without repeats), and its slot count.
type LoraState struct {
	Running, Waiting []string
	MaxLoras         int
	// Loaded is the adapters in a slot, running or idle, sorted; Loads counts the adapters
	// loaded since start.
	Loaded []string
	Loads  int64
}

// Lora returns the engine's adapter state at its latest time.
func (e *Engine) Lora() LoraState {
	st := LoraState{MaxLoras: e.cfg.MaxLoras, Loads: e.lora.loads}
	for i, n := range e.lora.names {
		st.Loaded = append(st.Loaded, n)
		if e.lora.users[i] > 0 {
			st.Running = append(st.Running, n)
		}
	}
	for _, r := range e.waiting[e.wh:] {
		if r.adapter != "" && !slices.Contains(st.Waiting, r.adapter) {
			st.Waiting = append(st.Waiting, r.adapter)
		}
	}
	slices.Sort(st.Running)
	slices.Sort(st.Waiting)
	slices.Sort(st.Loaded)
	return st
}

// Unload drops adapter from its slot at time now when no running request holds it, and reports
// whether it was loaded and idle.
func (e *Engine) Unload(now time.Duration, adapter string) bool {
	e.advance(now, false)
	i := slices.Index(e.lora.names, adapter)
	if i < 0 || e.lora.users[i] > 0 {
		return false
	}
	s := &e.lora
	s.names = slices.Delete(s.names, i, i+1)
	s.users = slices.Delete(s.users, i, i+1)
	s.used = slices.Delete(s.used, i, i+1)
	for _, r := range e.running {
		if r.loraSlot > i {
			r.loraSlot--
		}
	}
	return true
}

// CachedPrefixFor is CachedPrefix for a prompt of adapter ("" the base model).
func (e *Engine) CachedPrefixFor(adapter, text string) int {
	n := TokenCount(text)
	if n == 0 {
		return 0
	}
	var buf [256]uint64
	keys := blockKeysText(buf[:0], text, e.cfg.BlockSize)
	loraKeys(keys, adapter)
	m, _ := e.cache.match(keys)
	return min(m*e.cfg.BlockSize, n-1)
}
