package policy

import (
	"errors"
	"slices"
)

// The adapter term of the cost, L_w in seconds: what a request for a LoRA adapter pays on w for
// the adapter itself, beyond the prefill and decode terms.
//
//	L_w = 0                   the adapter runs on w (w's report lists it running, or this replica
//	                          sent w a request for it since that report): its weights are in a slot
//	L_w = LoRACost.Load       it is not running but a slot is free (the slots held by running
//	                          adapters, and those that waiting adapters will take, are fewer than
//	                          w's max_lora), or it is waiting there already: w loads it first
//	L_w = LoRACost.SlotWait   every slot is held by other adapters: the request waits for one
//	                          to free, then for the load
//
// A worker that reports no LoRA state (an SGLang engine, a vLLM without --enable-lora, a report
// that is not fresh) has L = 0: nothing is known to charge. The term keeps each adapter on the
// few engines that run it, so that engines do not swap adapters in and out of their slots; where
// its engines queue, Q and S outweigh L and the adapter spreads to an engine with a free slot.

// LoRACost holds the adapter term's constants, in seconds. Zero fields take the defaults of
// DefaultLoRACost.
type LoRACost struct {
	// Load is what an adapter costs where a slot is free: its load time. Default 0.05 s.
	Load float64 `yaml:"lora_load_seconds"`
	// SlotWait is what it costs where every slot is held by other adapters' requests: the
	// wait for one to finish, and the load. Default 1 s.
	SlotWait float64 `yaml:"lora_slot_wait_seconds"`
	// Blind turns the term off (L = 0 everywhere): the adapter-blind baseline the benchmarks
	// measure against. Default false.
	Blind bool `yaml:"lora_blind"`
}

// DefaultLoRACost returns the adapter term's defaults (see each field).
func DefaultLoRACost() LoRACost { return LoRACost{Load: 0.05, SlotWait: 1} }

func (c LoRACost) withDefaults() LoRACost {
	d := DefaultLoRACost()
	if c.Load == 0 {
		c.Load = d.Load
	}
	if c.SlotWait == 0 {
		c.SlotWait = d.SlotWait
	}
	return c
}

func (c LoRACost) validate() error {
	switch {
	case !(c.Load >= 0) || c.Load > 3600:
		return errors.New("lora_load_seconds must be in [0, 3600]")
	case !(c.SlotWait >= 0) || c.SlotWait > 3600:
		return errors.New("lora_slot_wait_seconds must be in [0, 3600]")
	}
	return nil
}

// maxSentAdapters bounds the adapters a replica remembers sending one worker since its report.
const maxSentAdapters = 16

// adapterTerms sets L of every candidate for a request of adapter ("" the base model: L = 0).
func (s *scorer) adapterTerms(av []costCand, adapter string) {
	if adapter == "" || s.cfg.LoRA.Blind {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range av {
		av[i].t.Adapter = s.adapterCost(&av[i], adapter)
	}
}

// adapterCost is L for one candidate; the caller holds s.mu.
func (s *scorer) adapterCost(c *costCand, adapter string) float64 {
	l := c.r.lora
	if !c.fresh || l == nil {
		return 0
	}
	var sent []string
	if c.st.adaptersAt.Equal(c.r.polled) {
		sent = c.st.adapters // sent since this report, not an older one
	}
	if l.Serves(adapter) || slices.Contains(sent, adapter) {
		return 0
	}
	if slices.Contains(l.Waiting, adapter) {
		return s.cfg.LoRA.Load
	}
	held := len(l.Running) + len(l.Waiting)
	for _, a := range sent {
		if !l.Serves(a) && !slices.Contains(l.Waiting, a) {
			held++
		}
	}
	if l.MaxLoras == 0 || int64(held) < l.MaxLoras {
		return s.cfg.LoRA.Load
	}
	return s.cfg.LoRA.SlotWait
}

// sentAdapter records that c's worker was sent a request for adapter, which runs there from now
// on as far as this replica knows (until the next report says otherwise).
func (s *scorer) sentAdapter(c *costCand, adapter string) {
	if adapter == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ws[c.w.ID]
	if st == nil {
		return // forgotten meanwhile
	}
	if !st.adaptersAt.Equal(c.r.polled) {
		// A newer report says what runs there now; the list starts again from it.
		st.adapters, st.adaptersAt = st.adapters[:0], c.r.polled
	}
	if slices.Contains(st.adapters, adapter) || len(st.adapters) >= maxSentAdapters {
		return
	}
	st.adapters = append(st.adapters, adapter)
}
