package engine

import (
	"errors"
	"fmt"
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
	// EmitTokens makes every decode step an event: NextEvent reports each step end and Advance
	// reports a Tokens event per request per step, which a streaming front needs to pace its
	// output. When false (the zero value, the fleet simulator's fast mode) NextEvent skips over
	// steps that only produce non-first tokens and no Tokens events are reported; Finished
	// still carries the completion token count.
	EmitTokens bool
}

// DefaultConfig returns the defaults of `kvgate sim`: 16-token blocks, 524288 KV tokens, 256
// running requests, 2048-token prefill chunks, 8000 prefill tokens/s, 6 ms + 0.35 ms per decoding
// request per step, 10 s statistics window, fast mode.
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
	}
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.KVTokens == 0 {
		c.KVTokens = d.KVTokens
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = d.MaxRunning
	}
	if c.PrefillChunk == 0 {
		c.PrefillChunk = d.PrefillChunk
	}
	if c.PrefillTPS == 0 {
		c.PrefillTPS = d.PrefillTPS
	}
	if c.DecodeBase == 0 {
		c.DecodeBase = d.DecodeBase
	}
	if c.DecodePerReq == 0 {
		c.DecodePerReq = d.DecodePerReq
	}
	if c.StatsWindow == 0 {
		c.StatsWindow = d.StatsWindow
	}
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
	}
	return nil
}
