package engine

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Config is the engine's cost model and capacity. Every field's zero value means "use the
// default" (see DefaultConfig), except EmitTokens, whose zero value is the fast mode.
type Config struct {
	// BlockSize is the tokens per KV block, the unit of prefix caching. Default 16.
	BlockSize int
	// KVTokens is the KV-cache capacity in tokens (rounded down to whole blocks). Default 524288.
	KVTokens int
	// MaxRunning is the most requests running (admitted) at once. Default 256.
	MaxRunning int
	// PrefillChunk is the most prompt tokens prefilled per step, shared by all requests in
	// prefill. Default 2048.
	PrefillChunk int
	// PrefillTPS is the prefill speed in tokens per second. Default 8000.
	PrefillTPS float64
	// DecodeBase is the fixed cost of a decode step. Default 6 ms.
	DecodeBase time.Duration
	// DecodePerReq is the added step cost per decoding request. Default 0.35 ms.
	DecodePerReq time.Duration
	// StatsWindow is the time constant of the moving averages in Load (generation throughput,
	// cache hit rate). Default 10 s.
	StatsWindow time.Duration
	// Timing is the timing model: TimingBatched (the zero value) or TimingPerSlot.
	Timing TimingModel
	// PrefillOverhead is a fixed cost added to every request's prefill under TimingPerSlot
	// (llm-d-inference-sim's prefill-overhead); TimingBatched ignores it. Default 0.
	PrefillOverhead time.Duration
	// LoadFactor is the slowdown under load of TimingPerSlot (llm-d-inference-sim's
	// time-factor-under-load): a request's prefill and inter-token times are multiplied by
	// 1 + (LoadFactor − 1)·(running − 1)/(MaxRunning − 1), from 1 with one request running to
	// LoadFactor with MaxRunning. Must be in [1, 100]; TimingBatched ignores it. Default 1 (no
	// slowdown).
	LoadFactor float64
	// EmitTokens makes every decode step an event: NextEvent reports each step end and Advance
	// reports a Tokens event per request per step, which a streaming front needs to pace its
	// output. When false (the zero value, the fleet simulator's fast mode) NextEvent skips over
	// steps that only produce non-first tokens and no Tokens events are reported; Finished
	// still carries the completion token count.
	EmitTokens bool
	// MaxLoras is the number of LoRA adapter slots (vLLM's --max-loras); 0, the default, leaves
	// adapters unmodelled beyond their own prefix cache: every adapter runs at once (lora.go).
	MaxLoras int
	// LoraLoad is the time to load an adapter into a slot. Default DefaultLoraLoad.
	LoraLoad time.Duration
}

// DefaultConfig returns the defaults of `kvgate sim`: 16-token blocks, 524288 KV tokens, 256
// running requests, 2048-token prefill chunks, 8000 prefill tokens/s, 6 ms + 0.35 ms per decoding
// request per step, 10 s statistics window, the batched timing model (no prefill overhead, load
// factor 1), fast mode.
func DefaultConfig() Config {
	return Config{
		BlockSize:    16,
		KVTokens:     524288,
		MaxRunning:   256,
		PrefillChunk: 2048,
		PrefillTPS:   8000,
		DecodeBase:   6 * time.Millisecond,
		DecodePerReq: 350 * time.Microsecond,
		StatsWindow:  10 * time.Second,
		LoadFactor:   1,
	}
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	c.BlockSize = cmp.Or(c.BlockSize, d.BlockSize)
	c.KVTokens = cmp.Or(c.KVTokens, d.KVTokens)
	c.MaxRunning = cmp.Or(c.MaxRunning, d.MaxRunning)
	c.PrefillChunk = cmp.Or(c.PrefillChunk, d.PrefillChunk)
	c.PrefillTPS = cmp.Or(c.PrefillTPS, d.PrefillTPS)
	c.DecodeBase = cmp.Or(c.DecodeBase, d.DecodeBase)
	c.DecodePerReq = cmp.Or(c.DecodePerReq, d.DecodePerReq)
	c.StatsWindow = cmp.Or(c.StatsWindow, d.StatsWindow)
	c.LoadFactor = cmp.Or(c.LoadFactor, d.LoadFactor)
	c.LoraLoad = cmp.Or(c.LoraLoad, DefaultLoraLoad)
	return c
}

// Validate reports the first invalid field of c after defaults are applied.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.BlockSize < 1:
		return fmt.Errorf("engine: block size %d must be positive", c.BlockSize)
	case c.KVTokens < c.BlockSize:
		return fmt.Errorf("engine: kv tokens %d must hold at least one block of %d", c.KVTokens, c.BlockSize)
	case c.MaxRunning < 1:
		return fmt.Errorf("engine: max running %d must be positive", c.MaxRunning)
	case c.PrefillChunk < 1:
		return fmt.Errorf("engine: prefill chunk %d must be positive", c.PrefillChunk)
	case !(c.PrefillTPS > 0) || c.PrefillTPS > 1e12:
		return fmt.Errorf("engine: prefill tokens/s %v must be in (0, 1e12]", c.PrefillTPS)
	case c.DecodeBase < 0 || c.DecodePerReq < 0:
		return errors.New("engine: decode costs must not be negative")
	case c.DecodeBase == 0 && c.DecodePerReq == 0:
		return errors.New("engine: decode costs must not both be zero")
	case c.StatsWindow < 0:
		return errors.New("engine: stats window must not be negative")
	case c.Timing != TimingBatched && c.Timing != TimingPerSlot:
		return fmt.Errorf("engine: unknown timing model %d", c.Timing)
	case c.PrefillOverhead < 0 || c.PrefillOverhead > time.Hour:
		return fmt.Errorf("engine: prefill overhead %v must be in [0, 1h]", c.PrefillOverhead)
	case !(c.LoadFactor >= 1 && c.LoadFactor <= 100):
		return fmt.Errorf("engine: load factor %v must be in [1, 100]", c.LoadFactor)
	case c.MaxLoras < 0 || c.MaxLoras > 1024:
		return fmt.Errorf("engine: max loras %d must be in [0, 1024]", c.MaxLoras)
	case c.LoraLoad < 0 || c.LoraLoad > time.Hour:
		return fmt.Errorf("engine: lora load time %v must be in [0, 1h]", c.LoraLoad)
	}
	return nil
}

// TimingModel says how an engine turns work into time. The zero value is TimingBatched.
type TimingModel uint8

const (
	// TimingBatched is continuous batching with chunked prefill, as vLLM and SGLang run: each
	// step prefills at most PrefillChunk tokens, shared by the requests in prefill oldest first,
	// and decodes one token for every other running request; a step lasts max(prefill tokens ÷
	// PrefillTPS, DecodeBase + DecodePerReq × decoding requests). Prefills queue behind each
	// other and stall decoding.
	TimingBatched TimingModel = iota
	// TimingPerSlot is llm-d-inference-sim's model: each of the MaxRunning slots serves one
	// request on its own clock. A request prefills its uncached prompt in PrefillOverhead +
	// uncached tokens ÷ PrefillTPS, then produces a token every DecodeBase (the inter-token
	// latency), both times the load factor (see LoadFactor) at its admission and at its first
	// token respectively; DecodePerReq and PrefillChunk are unused. Prefills never wait for each
	// other, only for a free slot. A request's KV blocks (prompt and every output token) are
	// reserved when it is admitted, so this model never preempts.
	TimingPerSlot
)

// String returns the flag name of m: "batched" or "per-slot".
func (m TimingModel) String() string {
	switch m {
	case TimingBatched:
		return "batched"
	case TimingPerSlot:
		return "per-slot"
	}
	return fmt.Sprintf("TimingModel(%d)", uint8(m))
}

// ParseTimingModel parses "batched" (or "") and "per-slot" (or "perslot", "per_slot").
func ParseTimingModel(s string) (TimingModel, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "batched":
		return TimingBatched, nil
	case "per-slot", "perslot", "per_slot":
		return TimingPerSlot, nil
	}
	return TimingBatched, fmt.Errorf("unknown engine timing model %q (want batched or per-slot)", s)
}
