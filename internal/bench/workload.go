package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Message is one chat message of a prompt.
type Message struct {
	// Role is "system", "user" or "assistant".
	Role string `json:"role"`
	// Content is the message text.
	Content string `json:"content"`
}

// Turn is one request of a session.
type Turn struct {
	// Messages is the whole prompt of this turn; in a multi-turn session it resends the history.
	Messages []Message
	// OutputTokens is how many tokens the request asks for (max_tokens). Zero means 1.
	OutputTokens int
	// PrefixID names the shared prefix the prompt starts with; "" when it starts with none.
	PrefixID string
	// Think is how long the client waits after the previous turn completed before it sends this
	// one. Zero for the first turn.
	Think time.Duration
	// Model is the model the request names, a LoRA adapter's id (WithAdapters); "" is the run's
	// model.
	Model string
}

// Text returns the routing text of the turn: the message contents concatenated in order, which is
// what the gateway's cache-aware matching sees for a chat request.
func (t *Turn) Text() string {
	if len(t.Messages) == 1 {
		return t.Messages[0].Content
	}
	n := 0
	for _, m := range t.Messages {
		n += len(m.Content)
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range t.Messages {
		b.WriteString(m.Content)
	}
	return b.String()
}

// Session is a sequence of turns sent one after the other: turn i+1 is sent Think after turn i
// completed. A single-request workload has one turn per session.
type Session struct {
	// ID is the session's index in the workload.
	ID int
	// Key is the session routing key (what a client would send as x-session-id).
	Key string
	// Turns are the requests, in order; never empty.
	Turns []Turn
	// At is the session's recorded arrival offset (trace replay); meaningful only when Timed.
	At time.Duration
	// Timed reports whether At holds a recorded arrival time.
	Timed bool
}

// Workload generates sessions. Session(k) must be a pure function of the workload's seed and k.
type Workload interface {
	// Name returns the workload's name as shown in reports.
	Name() string
	// Session returns session k (k >= 0). It returns false when the workload has fewer sessions.
	Session(k int) (Session, bool)
}

// Replay is implemented by workloads that replay a recorded trace: every session carries its own
// arrival time (Session.Timed), and the workload ends after Len sessions.
type Replay interface {
	Workload
	// Len returns the number of sessions.
	Len() int
}

var (
	_ Replay = (*Trace)(nil)
	_ Replay = (*Mooncake)(nil)
)

// rngFor returns an independent random stream for (seed, purpose, k).
func rngFor(seed uint64, purpose uint64, k int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15*(purpose+1), uint64(k)*0xbf58476d1ce4e5b9+purpose))
}

// vocabulary is a fixed list of short pseudo-words: each costs about one token in common
// tokenizers and the engine model, so a text of n words is a prompt of about n tokens.
var vocabulary = buildVocabulary()

func buildVocabulary() []string {
	cons := []string{"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"}
	vows := []string{"a", "e", "i", "o", "u"}
	out := make([]string, 0, len(cons)*len(vows)*len(cons))
	for _, c1 := range cons {
		for _, v := range vows {
			for _, c2 := range cons {
				out = append(out, c1+v+c2)
			}
		}
	}
	return out
}

// Words returns n space-separated pseudo-words drawn from r, ending with a space so that texts can
// be concatenated without merging words.
func Words(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 4)
	for i := 0; i < n; i++ {
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		b.WriteByte(' ')
	}
	return b.String()
}

// between returns a uniform int in [lo, hi].
func between(r *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return lo + r.IntN(hi-lo+1)
}

// SharedPrefix is the shared-prefix workload: Prefixes system prompts of about
// PrefixWords words; a request starts with one of them with probability Share (else with a unique
// text of the same length), followed by a unique tail of TailMin–TailMax words, and asks for
// OutputTokens tokens. The zero value is not useful; use NewSharedPrefix.
type SharedPrefix struct {
	// Seed fixes every text.
	Seed uint64
	// Prefixes is the number of system prompts; zero means every request is unshared.
	Prefixes int
	// PrefixWords is the system prompts' length (±10 %), also used for unshared openings.
	PrefixWords int
	// Share is the probability that a request starts with a system prompt.
	Share float64
	// TailMin and TailMax bound the unique tail in words.
	TailMin, TailMax int
	// OutputTokens is max_tokens of every request.
	OutputTokens int

	prompts []string
}

// NewSharedPrefix returns the shared-prefix workload with its defaults: 16
// prompts of about 200 words, 70 % shared, 16–128-word tails, 64 output tokens.
func NewSharedPrefix(seed uint64) *SharedPrefix {
	return (&SharedPrefix{Seed: seed, Prefixes: 16, PrefixWords: 200, Share: 0.7, TailMin: 16, TailMax: 128, OutputTokens: 64}).Init()
}

// Init (re)generates the system prompts after the fields were changed, and returns w.
func (w *SharedPrefix) Init() *SharedPrefix {
	w.prompts = seededTexts(w.Seed, 1, w.Prefixes, "System prompt %d. ", w.PrefixWords)
	return w
}

// seededTexts returns n texts, text i being title (formatted with i) and then words ±10 % words
// drawn from seed's stream i of the given kind, so that a workload's texts are the same for a
// seed whatever else it draws.
func seededTexts(seed, kind uint64, n int, title string, words int) []string {
	out := make([]string, n)
	for i := range out {
		r := rngFor(seed, kind, i)
		out[i] = fmt.Sprintf(title, i) + Words(r, between(r, words*9/10, words*11/10))
	}
	return out
}

// Name returns "shared-prefix".
func (*SharedPrefix) Name() string { return "shared-prefix" }

// Session returns the one-turn session k.
func (w *SharedPrefix) Session(k int) (Session, bool) {
	r := rngFor(w.Seed, 2, k)
	t := Turn{OutputTokens: w.OutputTokens}
	var system string
	if len(w.prompts) > 0 && r.Float64() < w.Share {
		p := r.IntN(len(w.prompts))
		system, t.PrefixID = w.prompts[p], fmt.Sprintf("sys-%d", p)
	} else {
		system = fmt.Sprintf("Request %d. ", k) + Words(r, between(r, w.PrefixWords*9/10, w.PrefixWords*11/10))
	}
	t.Messages = []Message{
		{Role: "system", Content: system},
		{Role: "user", Content: Words(r, between(r, w.TailMin, w.TailMax))},
	}
	return Session{ID: k, Key: fmt.Sprintf("s%d", k), Turns: []Turn{t}}, true
}

// MultiTurn is the multi-turn chat workload: each conversation has TurnsMin–TurnsMax turns; each
// turn adds a user message of UserMin–UserMax words and resends the whole history (earlier user
// messages and the assistant replies); a reply is OutMin–OutMax tokens; the client thinks for an
// exponentially distributed time of mean Think between turns. Assistant replies in the history are
// synthetic text of the requested length, fixed by the seed, so that every target is sent the
// same bytes. Use NewMultiTurn for the defaults.
type MultiTurn struct {
	// Seed fixes every conversation.
	Seed uint64
	// TurnsMin and TurnsMax bound the turns of a conversation.
	TurnsMin, TurnsMax int
	// UserMin and UserMax bound a user message in words.
	UserMin, UserMax int
	// OutMin and OutMax bound a reply in tokens.
	OutMin, OutMax int
	// Think is the mean think time between turns; zero means none.
	Think time.Duration
}

// NewMultiTurn returns the multi-turn workload with defaults: 3–10 turns, 20–120-word user
// messages, 32–256-token replies, 3 s mean think time.
func NewMultiTurn(seed uint64) *MultiTurn {
	return &MultiTurn{Seed: seed, TurnsMin: 3, TurnsMax: 10, UserMin: 20, UserMax: 120, OutMin: 32, OutMax: 256, Think: 3 * time.Second}
}

// Name returns "multi-turn".
func (*MultiTurn) Name() string { return "multi-turn" }

// Session returns conversation k.
func (w *MultiTurn) Session(k int) (Session, bool) {
	r := rngFor(w.Seed, 3, k)
	n := between(r, w.TurnsMin, w.TurnsMax)
	s := Session{ID: k, Key: fmt.Sprintf("c%d", k), Turns: make([]Turn, 0, n)}
	var history []Message
	for i := 0; i < n; i++ {
		user := Message{Role: "user", Content: fmt.Sprintf("Conversation %d turn %d. ", k, i) + Words(r, between(r, w.UserMin, w.UserMax))}
		history = append(history, user)
		t := Turn{Messages: history[:len(history):len(history)], OutputTokens: between(r, w.OutMin, w.OutMax)}
		if i > 0 && w.Think > 0 {
			t.Think = time.Duration(r.ExpFloat64() * float64(w.Think))
		}
		s.Turns = append(s.Turns, t)
		history = append(history, Message{Role: "assistant", Content: Words(r, t.OutputTokens)})
	}
	return s, true
}

// LongContext is the long-context tenants workload: Tenants tenants, each with a context of
// about ContextWords words (documents, a code base); a request is one tenant's whole context
// followed by a short question of QuestionMin–QuestionMax words, asking for OutputTokens tokens.
// Tenants are chosen uniformly. Use NewLongContext for the defaults.
type LongContext struct {
	// Seed fixes every text.
	Seed uint64
	// Tenants is the number of tenants; zero means the workload has no sessions.
	Tenants int
	// ContextWords is a tenant context's length (±10 %).
	ContextWords int
	// QuestionMin and QuestionMax bound a question in words.
	QuestionMin, QuestionMax int
	// OutputTokens is max_tokens of every request.
	OutputTokens int

	contexts []string
}

// NewLongContext returns the long-context workload with defaults: 150 tenants, ~6000-word
// contexts, 8–32-word questions, 64 output tokens.
func NewLongContext(seed uint64) *LongContext {
	return (&LongContext{Seed: seed, Tenants: 150, ContextWords: 6000, QuestionMin: 8, QuestionMax: 32, OutputTokens: 64}).Init()
}

// Init (re)generates the tenant contexts after the fields were changed, and returns w.
func (w *LongContext) Init() *LongContext {
	w.contexts = seededTexts(w.Seed, 4, w.Tenants, "Tenant %d context. ", w.ContextWords)
	return w
}

// Name returns "long-context".
func (*LongContext) Name() string { return "long-context" }

// Session returns the one-turn session k.
func (w *LongContext) Session(k int) (Session, bool) {
	if len(w.contexts) == 0 {
		return Session{}, false
	}
	r := rngFor(w.Seed, 5, k)
	tenant := r.IntN(len(w.contexts))
	t := Turn{
		Messages: []Message{
			{Role: "system", Content: w.contexts[tenant]},
			{Role: "user", Content: Words(r, between(r, w.QuestionMin, w.QuestionMax))},
		},
		OutputTokens: w.OutputTokens,
		PrefixID:     fmt.Sprintf("tenant-%d", tenant),
	}
	return Session{ID: k, Key: fmt.Sprintf("t%d", tenant), Turns: []Turn{t}}, true
}

// WorkloadNames lists the names NewWorkload accepts.
var WorkloadNames = []string{"shared-prefix", "multi-turn", "long-context", "trace", "mooncake-synth", "mooncake-agent"}

// NewWorkload builds a named synthetic workload with its defaults. A trace is loaded with
// LoadTrace instead.
func NewWorkload(name string, seed uint64) (Workload, error) {
	switch name {
	case "shared-prefix":
		return NewSharedPrefix(seed), nil
	case "multi-turn":
		return NewMultiTurn(seed), nil
	case "long-context":
		return NewLongContext(seed), nil
	case "trace":
		return nil, fmt.Errorf("workload trace needs a trace file (--trace FILE)")
	case "mooncake-synth", "mooncake-agent":
		g := NewMooncakeGen(seed)
		if name == "mooncake-agent" {
			g = NewMooncakeAgentGen(seed)
		}
		es, err := g.Generate()
		if err != nil {
			return nil, err
		}
		return NewMooncake(es, MooncakeOptions{Seed: seed})
	}
	return nil, fmt.Errorf("unknown workload %q (want %s)", name, strings.Join(WorkloadNames, ", "))
}
