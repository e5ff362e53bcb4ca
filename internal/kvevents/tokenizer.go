package kvevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/lru"
	"github.com/kvgate/kvgate/internal/worker"
)

// TokenizerConfig configures tokenization by the workers' POST /tokenize.
type TokenizerConfig struct {
	// Timeout bounds one tokenization; past it the request is routed by the prefix tree.
	// Default 100 ms.
	Timeout time.Duration
	// CacheTokens bounds the cache of tokenized prompts, in tokens. Default 1<<22 (16 MB).
	CacheTokens int
	// MaxTokens bounds the tokens accepted from one answer. Default 1<<20.
	MaxTokens int
	// Client sends the requests; nil means a client with the default transport that follows
	// redirects only on the worker's own origin (worker.CheckRedirect).
	Client *http.Client
}

func (c TokenizerConfig) withDefaults() TokenizerConfig {
	if c.Timeout <= 0 {
		c.Timeout = 100 * time.Millisecond
	}
	if c.CacheTokens <= 0 {
		c.CacheTokens = 1 << 22
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = 1 << 20
	}
	if c.Client == nil {
		c.Client = &http.Client{CheckRedirect: worker.CheckRedirect}
	}
	return c
}

// Tokenizer tokenizes prompts the way the model's engines do, by asking a worker's /tokenize
// (vLLM's and SGLang's shape: {"model", "prompt"} or {"model", "messages"} answered with
// {"count", "max_model_len", "tokens"}), so chat templates are the engine's own. A bounded LRU
// cache keyed by the request's content answers a repeated prompt without asking again. Safe for
// concurrent use.
type Tokenizer struct {
	cfg  TokenizerConfig
	seed maphash.Seed

	mu    sync.Mutex
	cache *lru.Cache[uint64, []uint32] // bounded by CacheTokens, each prompt costing its tokens

	hits, misses, failures uint64
}

// NewTokenizer returns a Tokenizer.
func NewTokenizer(cfg TokenizerConfig) *Tokenizer {
	c := cfg.withDefaults()
	return &Tokenizer{cfg: c, seed: maphash.MakeSeed(), cache: lru.New[uint64, []uint32](c.CacheTokens)}
}

// TokenizerStats counts cache hits, tokenizations asked of workers and those that failed.
type TokenizerStats struct{ Hits, Misses, Failures uint64 }

// Stats returns the counters.
func (t *Tokenizer) Stats() TokenizerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TokenizerStats{t.hits, t.misses, t.failures}
}

// Tokenize returns the token ids of a request for model: a chat request's messages (taken from
// its body) or else text, asking worker via within the configured timeout (and ctx) on a cache
// miss. The cache is keyed by the model and the prompt alone (a chat request's messages value,
// not its body): the same conversation resent with another max_tokens, stream flag, user or
// sampling parameter is the same prompt, tokenized once.
func (t *Tokenizer) Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	var messages json.RawMessage
	if chat {
		var b struct {
			Messages json.RawMessage `json:"messages"`
		}
		if err := json.Unmarshal(body, &b); err != nil || len(b.Messages) == 0 {
			t.mu.Lock()
			t.failures++
			t.mu.Unlock()
			return nil, fmt.Errorf("%w: no messages in the body", errTokenize)
		}
		messages = b.Messages
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(model)
	h.WriteByte(0)
	if chat {
		h.WriteByte('c')
		h.Write(messages)
	} else {
		h.WriteByte('t')
		h.WriteString(text)
	}
	key := h.Sum64()
	t.mu.Lock()
	if toks, ok := t.cache.Get(key); ok {
		t.hits++
		t.mu.Unlock()
		return toks, nil
	}
	t.misses++
	t.mu.Unlock()
	toks, err := t.ask(ctx, via, model, messages, text)
	if err != nil {
		t.mu.Lock()
		t.failures++
		t.mu.Unlock()
		return nil, err
	}
	t.put(key, toks)
	return toks, nil
}

func (t *Tokenizer) put(key uint64, toks []uint32) {
	if len(toks) > t.cfg.CacheTokens {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.cache.Get(key); ok {
		return // another request tokenized it meanwhile
	}
	t.cache.Add(key, toks, len(toks))
}

// errTokenize is the error of a failed tokenization (its cause is wrapped for logs only).
var errTokenize = errors.New("kvevents: tokenize")

// ask posts the request to via's /tokenize: messages when set (a chat request's), else text.
func (t *Tokenizer) ask(ctx context.Context, via *worker.Worker, model string, messages json.RawMessage, text string) ([]uint32, error) {
	req := map[string]any{"model": model}
	if messages != nil {
		req["messages"] = messages
	} else {
		if text == "" {
			return nil, fmt.Errorf("%w: no prompt text", errTokenize)
		}
		req["prompt"] = text
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, via.URL.JoinPath("tokenize").String(), bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if k := via.Spec.APIKey; k != "" {
		hr.Header.Set("Authorization", "Bearer "+k)
	}
	res, err := t.cfg.Client.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		return nil, fmt.Errorf("%w: status %d", errTokenize, res.StatusCode)
	}
	// Each token takes at least two bytes of JSON ("1,"), so this bounds what is read.
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, int64(t.cfg.MaxTokens)*12+4096)).Decode(&out); err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	if len(out.Tokens) > t.cfg.MaxTokens {
		return nil, fmt.Errorf("%w: %d tokens", errTokenize, len(out.Tokens))
	}
	return out.Tokens, nil
}

// View is precise routing's view of a fleet: the event index and the tokenizer together.
type View struct {
	Service   *Service
	Tokenizer *Tokenizer
	now       func() time.Time
}

// NewView joins s and t.
func NewView(s *Service, t *Tokenizer) *View { return &View{Service: s, Tokenizer: t, now: s.cfg.Now} }

// Tokenize is Tokenizer.Tokenize.
func (v *View) Tokenize(ctx context.Context, via *worker.Worker, model string, chat bool, body []byte, text string) ([]uint32, error) {
	return v.Tokenizer.Tokenize(ctx, via, model, chat, body, text)
}

// Covers is Index.Covers at the current time.
func (v *View) Covers(model string, workers []string) bool {
	return v.Service.idx.Covers(model, workers, v.now())
}

// Match is Index.Match at the current time.
func (v *View) Match(model string, toks []uint32, workers []string, out []int) bool {
	return v.Service.idx.Match(model, toks, workers, out, v.now())
}

// CoversAny is Index.CoversAny at the current time.
func (v *View) CoversAny(model string, workers []string) bool {
	return v.Service.idx.CoversAny(model, workers, v.now())
}

// MatchEach is Index.MatchEach at the current time.
func (v *View) MatchEach(model string, toks []uint32, workers []string, out []int) int {
	return v.Service.idx.MatchEach(model, toks, workers, out, v.now())
}

// MatchSalted is Index.MatchSalted at the current time (policy.SaltedMatcher).
func (v *View) MatchSalted(model string, salt uint64, toks []uint32, workers []string, out []int) bool {
	return v.Service.idx.MatchSalted(model, salt, toks, workers, out, v.now())
}
