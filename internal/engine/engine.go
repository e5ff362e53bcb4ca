// Package engine models one LLM inference engine (vLLM- or SGLang-like) as a pure state machine
// in virtual time: continuous batching with chunked prefill, a paged KV cache of fixed-size
// blocks, and a prefix cache over those blocks with least-recently-used eviction. It has no
// goroutines, sleeps or clock reads: the caller passes the time in. The same model serves real
// traffic on real ports (package sim, driven by the wall clock) and replays hours of traffic in
// seconds (the fleet simulator, driven by a discrete-event loop), so a routing result measured in
// virtual time comes from the code that serves traffic.
//
// # API
//
// Time is a time.Duration since the engine's start; it never goes back (an earlier time is
// treated as the latest time seen).
//
//	e, err := engine.New(engine.DefaultConfig())
//	err = e.Submit(now, engine.Request{ID: 1, Text: prompt, MaxTokens: 64})
//	at, ok := e.NextEvent()          // when the next event happens, if any
//	evs = e.Advance(at, evs[:0])     // move to a time; the events that happened, in order
//	e.Abort(now, 1)                  // drop a request; its KV blocks are freed at once
//	l := e.Load()                    // the load report at the latest time
//
// Submit and Abort may move the next event earlier (a new request joins the next step, which
// ends a run of identical decode steps early), so re-read NextEvent after calling them.
//
// Events are Admitted (with the cached prompt tokens), FirstToken (with the TTFT), Tokens (with a
// count; only when Config.EmitTokens is set) and Finished (with prompt, cached and completion
// tokens). A discrete-event caller loops on NextEvent and Advance; a real-time caller advances
// to the wall clock and sleeps until NextEvent.
//
// # The model
//
// Text is tokenized deterministically (Tokenize: about 4 bytes per token). Prompts are split in
// blocks of Config.BlockSize tokens; the key of a block chains over every token before it, so a
// block matches only when the whole prefix up to it matches. A request's cached tokens are its
// longest run of cached blocks from the start (at most the prompt minus one token, which is
// always computed, as real engines do).
//
// Each step, the engine first grows the KV of decoding requests (preempting the most recently
// admitted request, vLLM's recompute policy, when the cache is exhausted), then admits waiting
// requests first-in-first-out while fewer than MaxRunning run and the cache can hold the
// request's uncached prompt (cached blocks of running requests are pinned; other cached blocks
// are evicted least-recently-used), then prefills at most PrefillChunk prompt tokens, oldest
// request first, and decodes one token for every request past prefill. A step lasts
// max(prefill tokens / PrefillTPS, DecodeBase + DecodePerReq × decoding requests); its tokens
// appear at its end. The step that completes a prompt yields the request's first token. TTFT
// therefore grows with the uncached prompt and with queueing, inter-token latency with the batch
// size, and a full KV cache makes requests wait.
//
// That is the batched timing model (TimingBatched, the default). Under TimingPerSlot, the model
// of llm-d-inference-sim, each of the MaxRunning slots serves one request on its own clock: a
// request prefills its uncached prompt in PrefillOverhead + uncached tokens ÷ PrefillTPS and then
// produces a token every DecodeBase, both scaled by Config.LoadFactor with the number of requests
// running; prefills never wait for one another, only for a free slot, and a request's KV blocks
// are reserved in full when it is admitted. The prefix cache and the queue are the same in both.
//
// Only full prompt blocks enter the prefix cache; generated tokens and the partial last prompt
// block are private to their request and freed when it ends.
//
// Consecutive decode-only steps with the same batch are applied as one run, so the cost of
// simulating a stretch of decoding does not grow with its length in fast mode.
package engine

import (
	"errors"
	"fmt"
	"time"
)

// EventKind says what an Event reports. The zero value is not a valid kind.
type EventKind uint8

const (
	// Admitted: the request left the queue and started prefill. CachedTokens and PromptTokens
	// are set. Reported once per request (not again after a preemption).
	Admitted EventKind = iota + 1
	// FirstToken: the request's first output token. TTFT is set; Tokens is 1.
	FirstToken
	// Tokens: Tokens more output tokens (only when Config.EmitTokens is set).
	Tokens
	// Finished: the request produced its last token and left the engine. TTFT, PromptTokens,
	// CachedTokens and CompletionTokens are set.
	Finished
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case Admitted:
		return "admitted"
	case FirstToken:
		return "first_token"
	case Tokens:
		return "tokens"
	case Finished:
		return "finished"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is something that happened to one request. Fields a kind does not set are zero.
type Event struct {
	Kind EventKind
	// ID is the request's id.
	ID uint64
	// At is when it happened.
	At time.Duration
	// Tokens is the number of output tokens this event reports (FirstToken: 1; Tokens: ≥ 1).
	Tokens int
	// TTFT is the time from submission to the first token.
	TTFT time.Duration
	// PromptTokens, CachedTokens and CompletionTokens are the request's usage.
	PromptTokens, CachedTokens, CompletionTokens int
}

// Request is one generation request.
type Request struct {
	// ID identifies the request; it must be unique among the engine's live requests.
	ID uint64
	// Tokens is the prompt; when nil, Text is tokenized instead.
	Tokens []uint32
	// Text is the prompt text, used when Tokens is nil.
	Text string
	// MaxTokens is the number of output tokens to generate; it must be at least 1 (the model
	// never stops early).
	MaxTokens int
	// Adapter names the LoRA adapter the request runs on; "" is the base model. Its prompt's
	// blocks are the adapter's own, and with Config.MaxLoras set it needs an adapter slot
	// (lora.go).
	Adapter string
	// Salt is the prompt's cache salt (vLLM's cache_salt), "" for none: mixed into every block's
	// key (salt.go), so that prompts of different salts share no cached block.
	Salt string
}

// Errors returned by Submit.
var (
	ErrDuplicateID = errors.New("engine: duplicate request id")
	ErrEmptyPrompt = errors.New("engine: empty prompt")
	ErrMaxTokens   = errors.New("engine: max tokens must be at least 1")
	ErrTooLong     = errors.New("engine: prompt plus max tokens exceed the KV cache")
)

// reqState is where a request is.
type reqState uint8

const (
	waiting reqState = iota
	running
	gone
)

// req is the engine's record of one request.
type req struct {
	id       uint64
	state    reqState
	started  bool // produced its first token
	admitted bool // was ever admitted
	arrival  time.Duration
	firstAt  time.Duration
	// scheduled is when the request's prefill first started (its first chunk, or its slot's
	// prefill clock), began whether it has: vLLM's request_prefill_time_seconds runs from the
	// step that first schedules a request to its first token.
	scheduled time.Duration
	began     bool
	keys      []uint64
	promptLen int
	maxTokens int
	generated int
	target    int // tokens to compute before the next token: the prompt (plus output after a preemption)
	computed  int
	cached    int
	pinned    []blockID
	toks      []uint32 // the prompt's tokens, kept only while a CacheObserver is set
	salt      string   // the prompt's cache salt, "" for none
	priv      int      // private blocks held
	uncached  int      // this request's share of Load().WaitingUncachedTokens while waiting

	// TimingPerSlot only (slot.go): the time of the request's next event, its index in the
	// engine's slot heap (-1 when not in it), its admission order (ties in the heap), when its
	// prefill started and how long it lasts, and its inter-token latency.
	due         time.Duration
	slot        int
	seq         uint64
	prefillFrom time.Duration
	prefillDur  time.Duration
	itl         time.Duration

	// adapter is the request's LoRA adapter ("" the base model); loraSlot the slot it holds
	// while running (-1 none), loraLoad whether its admission loaded the adapter.
	adapter  string
	loraSlot int
	loraLoad bool
}

func (r *req) held() int { return len(r.pinned) + r.priv }

// Engine is one simulated inference engine. It is not safe for concurrent use; the zero value is
// not usable (use New).
type Engine struct {
	cfg   Config
	cache *cache
	now   time.Duration

	byID     map[uint64]*req
	waiting  []*req
	wh       int // head of waiting
	running  []*req
	uncached int64

	// The current run: steps identical steps of stepDur from stepStart, done of them applied.
	busy       bool
	stepStart  time.Duration
	stepDur    time.Duration
	steps      int
	done       int
	plan       []chunk
	decoders   []*req
	startAt    time.Duration // when idle with work queued: when the next step starts
	startQueue bool

	pending []Event
	stats   stats

	// TimingPerSlot only: the running requests by next event, and the admission counter.
	slots slotHeap
	seq   uint64

	// lora is the adapter slots (Config.MaxLoras; lora.go).
	lora loraSlots

	// Request records are recycled, with their key and block buffers: a request that leaves
	// goes to retired, and from there to spare when the next step starts (only then can no
	// step plan refer to it any more).
	retired, spare []*req
}

// chunk is one request's share of a step's prefill.
type chunk struct {
	r *req
	n int
}

// New returns an idle engine at time 0. Zero fields of cfg take their defaults.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	return &Engine{
		cfg:   cfg,
		cache: newCache(cfg.KVTokens / cfg.BlockSize),
		byID:  make(map[uint64]*req),
	}, nil
}

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Now returns the latest time the engine has been moved to.
func (e *Engine) Now() time.Duration { return e.now }

// Submit queues r at time now. Events that happen up to now are kept for the next Advance. A
// request submitted exactly when a step starts joins that step, so requests submitted at the
// same time are batched together.
func (e *Engine) Submit(now time.Duration, r Request) error {
	if _, dup := e.byID[r.ID]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicateID, r.ID)
	}
	if r.MaxTokens < 1 {
		return ErrMaxTokens
	}
	bs := e.cfg.BlockSize
	n := len(r.Tokens)
	if r.Tokens == nil {
		n = TokenCount(r.Text)
	}
	if n == 0 {
		return ErrEmptyPrompt
	}
	if ceilDiv(n+r.MaxTokens, bs) > e.cache.total {
		return fmt.Errorf("%w: %d+%d tokens, capacity %d", ErrTooLong, n, r.MaxTokens, e.cache.total*bs)
	}
	e.advance(now, false)
	q := e.newReq()
	keys := q.keys[:0]
	if r.Tokens != nil {
		keys = blockKeys(keys, r.Tokens, bs)
	} else {
		keys = blockKeysText(keys, r.Text, bs)
	}
	loraKeys(keys, r.Adapter)
	saltKeys(keys, r.Salt)
	toks := q.toks[:0]
	if e.cache.obs != nil {
		if r.Tokens != nil {
			toks = append(toks, r.Tokens...)
		} else {
			toks = AppendTokens(toks, r.Text)
		}
	}
	*q = req{id: r.ID, arrival: e.now, keys: keys, promptLen: n, maxTokens: r.MaxTokens, target: n,
		pinned: q.pinned[:0], toks: toks, slot: -1,
		adapter: r.Adapter, loraSlot: -1, salt: r.Salt}
	e.byID[r.ID] = q
	e.enqueue(q, false)
	e.workArrived()
	return nil
}

// enqueue puts q in the waiting queue, at its head when front is set.
func (e *Engine) enqueue(q *req, front bool) {
	m, _ := e.cache.match(q.keys)
	q.state = waiting
	q.uncached = q.target - min(m*e.cfg.BlockSize, q.target-1)
	e.uncached += int64(q.uncached)
	if !front {
		e.waiting = append(e.waiting, q)
		return
	}
	if e.wh > 0 {
		e.wh--
		e.waiting[e.wh] = q
		return
	}
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = q
}

// workArrived makes the engine start a step now when idle, or end its current run after the
// step in progress so that the next step sees the change.
func (e *Engine) workArrived() {
	if !e.busy {
		if !e.startQueue {
			e.startQueue, e.startAt = true, e.now
		}
		return
	}
	if e.steps > e.done+1 {
		e.steps = e.done + 1
	}
}

// Abort removes request id at time now, freeing its KV blocks, and reports whether it was live.
// No event is reported for it afterwards.
func (e *Engine) Abort(now time.Duration, id uint64) bool {
	e.advance(now, false)
	r, ok := e.byID[id]
	if !ok {
		return false
	}
	switch r.state {
	case waiting:
		for i := e.wh; i < len(e.waiting); i++ {
			if e.waiting[i] == r {
				e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
				break
			}
		}
		e.uncached -= int64(r.uncached)
	case running:
		e.removeRunning(r)
		e.releaseKV(r)
		e.workArrived()
	}
	e.retire(r)
	e.stats.aborted++
	return true
}

// FlushCache drops every cached block not pinned by a running request, at time now, and returns
// the number of tokens dropped.
func (e *Engine) FlushCache(now time.Duration) int {
	e.advance(now, false)
	e.cache.at = e.now
	return e.cache.flush() * e.cfg.BlockSize
}

// NextEvent returns when the engine's next event happens; ok is false when the engine is idle
// with nothing queued. Events already due (produced by Submit or Abort) make it return Now.
func (e *Engine) NextEvent() (at time.Duration, ok bool) {
	switch {
	case len(e.pending) > 0:
		return e.now, true
	case e.cfg.Timing == TimingPerSlot:
		return e.nextSlotEvent()
	case e.busy && e.cfg.EmitTokens:
		return e.stepStart + time.Duration(e.done+1)*e.stepDur, true
	case e.busy:
		return e.stepStart + time.Duration(e.steps)*e.stepDur, true
	case e.startQueue:
		return e.startAt, true
	}
	return 0, false
}

// Advance moves the engine to time now and appends to dst the events that happened up to now,
// in the order they happened, returning the extended slice.
func (e *Engine) Advance(now time.Duration, dst []Event) []Event {
	e.advance(now, true)
	dst = append(dst, e.pending...)
	clear(e.pending)
	e.pending = e.pending[:0]
	return dst
}

// advance applies every step that ends by now and starts the steps that follow; a step due to
// start exactly at now is started only when inclusive is set, so that a Submit at now can still
// join it.
func (e *Engine) advance(now time.Duration, inclusive bool) {
	if e.cfg.Timing == TimingPerSlot {
		e.advanceSlots(now, inclusive)
		return
	}
	now = max(now, e.now)
	for {
		if e.busy {
			n := min(int((now-e.stepStart)/e.stepDur), e.steps)
			if n > e.done {
				e.apply(n-e.done, e.stepStart+time.Duration(n)*e.stepDur)
				e.done = n
			}
			if e.done < e.steps {
				break
			}
			e.busy = false
			e.startQueue, e.startAt = true, e.stepStart+time.Duration(e.steps)*e.stepDur
			continue
		}
		if e.startQueue && (e.startAt < now || inclusive && e.startAt == now) {
			e.startQueue = false
			e.startStep(e.startAt)
			continue
		}
		break
	}
	e.now = now
}

// Live returns the number of requests in the engine (running or waiting).
func (e *Engine) Live() int { return len(e.byID) }

// newReq returns a recycled request record, or a new one. Its fields are stale except for the
// capacity of its keys and pinned buffers.
func (e *Engine) newReq() *req {
	n := len(e.spare)
	if n == 0 {
		return new(req)
	}
	q := e.spare[n-1]
	e.spare[n-1] = nil
	e.spare = e.spare[:n-1]
	return q
}

// retire removes r, which has left the waiting and running lists, from the engine.
func (e *Engine) retire(r *req) {
	r.state = gone
	delete(e.byID, r.id)
	e.retired = append(e.retired, r)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// CachedPrefix returns how many leading tokens of text would hit the prefix cache if a request
// for it were admitted now: the engine's true longest cached prefix (whole blocks, at most the
// prompt minus one token, as admission counts them). It changes nothing, not even LRU order.
// It is what an oracle router with exact knowledge of the engine's cache would read.
func (e *Engine) CachedPrefix(text string) int {
	n := TokenCount(text)
	if n == 0 {
		return 0
	}
	var buf [256]uint64
	m, _ := e.cache.match(blockKeysText(buf[:0], text, e.cfg.BlockSize))
	return min(m*e.cfg.BlockSize, n-1)
}
