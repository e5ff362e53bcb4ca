package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/kvevents"
)

// Server is one simulated inference server: an http.Handler over one engine, advanced to the
// wall clock by a driver goroutine that NewServer starts and Close stops. Safe for concurrent
// use.
type Server struct {
	cfg   Config
	start time.Time
	mux   *http.ServeMux

	nextID atomic.Uint64
	faults atomic.Pointer[faultState]
	// convs are the Responses API responses this server gave, for follow-up turns.
	convs conversations
	// loras are the LoRA adapters served (lora.go).
	loras adapters

	// mu guards the engine and everything the driver shares with the handlers.
	mu      sync.Mutex
	eng     *engine.Engine
	waiters map[uint64]*waiter
	rng     *rand.Rand
	ttft    histogram
	evs     []engine.Event
	// pub publishes the engine's KV-cache events, batch gathering them; nil when off.
	pub   *kvevents.Publisher
	batch kvevents.Batch
	// storedSalt is the salt of the prompt whose first block is stored next (events.go).
	storedSalt string
	// storedAdapter is the LoRA adapter of the block stored next (events_lora.go).
	storedAdapter string

	wake      chan struct{} // work arrived: the driver recomputes its next wake-up
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the driver has exited
	closeOnce sync.Once

	// aborted, when set (by tests, before any request), receives the id of every request
	// aborted because its client left or its connection was dropped.
	aborted chan<- uint64
}

var _ http.Handler = (*Server)(nil)

// faultState is the active faults and when the slow start ends.
type faultState struct {
	Faults
	slowUntil time.Time
}

// waiter is a handler's view of its request in the engine; its fields are guarded by
// Server.mu, and notify (capacity 1) is signalled whenever they change.
type waiter struct {
	notify   chan struct{}
	admitted bool
	cached   int
	prompt   int
	tokens   int
	done     bool
}

func (w *waiter) signal() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// NewServer returns a running Server. It panics on an invalid cfg; check cfg.Validate first when
// cfg comes from a user.
func NewServer(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	eng, err := engine.New(cfg.Engine)
	if err != nil {
		panic(err)
	}
	s := &Server{
		cfg:     cfg,
		start:   time.Now(),
		eng:     eng,
		waiters: make(map[uint64]*waiter),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x6b76)),
		ttft:    newHistogram(ttftBuckets),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for _, m := range cfg.LoraModules {
		_ = s.loras.add(m) // validated, and unique by Validate's caller (ParseLoraModules)
	}
	s.SetFaults(cfg.Faults)
	s.routes()
	go s.drive()
	return s
}

// Close stops the driver goroutine and waits for it to exit. Requests still waiting on the
// engine fail at once. Close is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	s.closeEvents()
}

// Config returns the server's configuration with defaults applied.
func (s *Server) Config() Config { return s.cfg }

// SetFaults replaces the injected faults; a SlowStart runs from now. It panics on invalid
// faults (see Faults.Validate).
func (s *Server) SetFaults(f Faults) {
	if err := f.Validate(); err != nil {
		panic(err)
	}
	s.faults.Store(&faultState{Faults: f, slowUntil: time.Now().Add(f.SlowStart)})
}

// Faults returns the injected faults.
func (s *Server) Faults() Faults { return s.faults.Load().Faults }

// Load returns the engine's load report now.
func (s *Server) Load() engine.Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncLocked()
	return s.eng.Load()
}

// FlushCache empties the prefix cache (blocks of running requests stay) and returns the tokens
// dropped.
func (s *Server) FlushCache() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.eng.FlushCache(s.since())
	s.publishEvents()
	return n
}

// since is the engine time now.
func (s *Server) since() time.Duration { return time.Since(s.start) }

// syncLocked advances the engine to now and hands the events to their waiters.
func (s *Server) syncLocked() {
	s.evs = s.eng.Advance(s.since(), s.evs[:0])
	s.publishEvents()
	for _, ev := range s.evs {
		w := s.waiters[ev.ID]
		if w == nil {
			continue
		}
		switch ev.Kind {
		case engine.Admitted:
			w.admitted, w.cached, w.prompt = true, ev.CachedTokens, ev.PromptTokens
		case engine.FirstToken:
			s.ttft.observe(ev.TTFT.Seconds())
			w.tokens += ev.Tokens
		case engine.Tokens:
			w.tokens += ev.Tokens
		case engine.Finished:
			w.done = true
			delete(s.waiters, ev.ID)
		}
		w.signal()
	}
}

// drive is the driver goroutine: it advances the engine to the wall clock at each of its
// events, and sleeps in between until the next event or new work.
func (s *Server) drive() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		s.syncLocked()
		next, ok := s.eng.NextEvent()
		s.mu.Unlock()
		var tick <-chan time.Time
		if ok {
			d := next - s.since()
			if d <= 0 {
				continue
			}
			timer.Reset(d)
			tick = timer.C
		}
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-tick:
		}
	}
}

// submit enters a request into the engine and returns its id and waiter.
func (s *Server) submit(r request, maxTokens int, notify chan struct{}) (uint64, *waiter, error) {
	id := s.nextID.Add(1)
	w := &waiter{notify: notify}
	text, toks, _ := r.enginePrompt(s.blockSize())
	s.mu.Lock()
	err := s.eng.Submit(s.since(), engine.Request{ID: id, Tokens: toks, Text: text, MaxTokens: maxTokens, Adapter: r.adapter, Salt: r.salt})
	if err == nil {
		s.waiters[id] = w
	}
	s.publishEvents()
	s.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	s.kick()
	return id, w, nil
}

// abort drops request id from the engine, freeing its KV.
func (s *Server) abort(id uint64) {
	s.mu.Lock()
	delete(s.waiters, id)
	s.eng.Abort(s.since(), id)
	s.publishEvents()
	s.mu.Unlock()
	s.kick()
	if s.aborted != nil {
		s.aborted <- id
	}
}

// kick wakes the driver.
func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// rollError reports whether this request draws the injected error status.
func (s *Server) rollError(rate float64) bool {
	if rate <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64() < rate
}

// apiError is the OpenAI error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// writeError writes an OpenAI-shaped error.
func writeError(w http.ResponseWriter, status int, typ, code, param, format string, a ...any) {
	body := apiError{Error: apiErrorBody{Message: fmt.Sprintf(format, a...), Type: typ}}
	if code != "" { // the OpenAI shape: a string code, or null
		body.Error.Code = &code
	}
	if param != "" {
		body.Error.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
