package gateway

import (
	"bytes"
	"cmp"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/lru"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/proxy"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/worker"
)

// The Responses API, POST /v1/responses, is proxied like the other inference routes (streaming
// too: its events are relayed as they come). What is its own is the follow-up turn: a request
// with "previous_response_id" continues a conversation that the worker which answered that
// response holds (vLLM and SGLang keep stored responses in the server's memory, and its KV cache
// holds the conversation so far). So the gateway remembers which worker gave each response id,
// and sends a follow-up back to it while it is available; otherwise — an id it never saw (another
// replica's, or one it has forgotten), a worker gone, draining, unhealthy or with its circuit
// open — the model's policy routes the request on its text, as for any other request.
//
// What is remembered is bounded: at most ResponsesConfig.MaxEntries ids, least recently used
// dropped first, each for at most ResponsesConfig.TTL after it was answered. An id is read from
// the start of the worker's answer (the top-level "id" of a JSON body, the "response.id" of a
// stream's first event), at most responseIDMax bytes of printable ASCII; a worker that sends none
// is routed by policy next time. The ids come from workers, never from clients: a client that
// names another's response id is routed to that worker, which decides whether to serve it; and a
// worker cannot take over an id another worker gave (remember).

// ResponsesConfig bounds the memory of which worker answered each response id.
type ResponsesConfig struct {
	// MaxEntries is how many response ids are remembered; the least recently used goes first.
	// Default 65536: 15 MB of heap with vLLM's 40-byte ids, 20 MB at the 128-byte cap
	// (BenchmarkResponseAffinity). Negative turns the memory off.
	MaxEntries int
	// TTL is how long after it was answered a response id is remembered. Default 1h.
	TTL time.Duration
}

func (c ResponsesConfig) withDefaults() ResponsesConfig {
	c.MaxEntries = cmp.Or(c.MaxEntries, 65536)
	c.TTL = cmp.Or(max(c.TTL, 0), time.Hour)
	return c
}

const (
	// responseIDMax bounds a remembered response id.
	responseIDMax = 128
	// responseHeadMax is how much of a worker's answer is kept to find the response id in.
	responseHeadMax = 8 << 10
	// BranchPreviousResponse is the decision branch of a follow-up turn sent back to the worker
	// that answered the turn it follows.
	BranchPreviousResponse = "previous_response"
)

// responseAffinity remembers which worker answered each response id: an LRU bounded in entries
// and in time (lru.Cache, one entry a response id, its deadline fixed when it was answered: a
// lookup moves an id to the front without renewing it). Safe for concurrent use.
type responseAffinity struct {
	ttl time.Duration
	now func() time.Time

	mu  sync.Mutex
	ids *lru.Cache[string, string] // response id → worker id; nil when the memory is off
}

func newResponseAffinity(c ResponsesConfig, now func() time.Time) *responseAffinity {
	c = c.withDefaults()
	a := &responseAffinity{ttl: c.TTL, now: now}
	if c.MaxEntries >= 0 {
		a.ids = lru.New[string, string](c.MaxEntries)
	}
	return a
}

// deadline is the last instant an id answered at now is remembered: it is gone once TTL has
// passed (lru.Cache keeps an entry through its deadline).
func (a *responseAffinity) deadline(now time.Time) time.Time { return now.Add(a.ttl - time.Nanosecond) }

// remember records that workerID answered response id. An id already remembered for another
// worker, and not expired, stays with it: engines draw ids at random, so a second worker giving
// the same id is one trying to draw another conversation's follow-ups to itself.
func (a *responseAffinity) remember(id, workerID string) {
	if a.ids == nil || id == "" {
		return
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if w, dl, ok := a.ids.Peek(id); ok {
		if w != workerID && !now.After(dl) {
			return
		}
		a.ids.AddUntil(id, workerID, 1, a.deadline(now))
		return
	}
	a.ids.AddUntil(id, workerID, 1, a.deadline(now))
	// The least recently used entries are the likeliest to have expired: drop those, so that
	// expired entries do not wait for the table to fill.
	a.ids.Expire(now, -1)
}

// lookup returns the worker that answered response id, if it is remembered and not expired.
func (a *responseAffinity) lookup(id string) (string, bool) {
	if id == "" || a.ids == nil {
		return "", false
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids.GetLive(id, now)
}

// forget drops response id: the response was deleted, or its worker no longer has it.
func (a *responseAffinity) forget(id string) {
	if a.ids == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids.Remove(id)
}

// len returns how many ids are remembered.
func (a *responseAffinity) len() int {
	if a.ids == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids.Len()
}

// responsePicker sends a follow-up turn's first attempt to the worker that answered the turn it
// follows, while that worker is a candidate and available; every other pick (no such worker, a
// retry) is the policy's.
func (s *Server) responsePicker(next proxy.Picker, candidates []*worker.Worker, prev string, req *policy.Request, polName string, tr *tracing.Request) proxy.Picker {
	id, ok := s.responseWorker(prev)
	if !ok {
		return next
	}
	return func(tried []*worker.Worker) *worker.Worker {
		if len(tried) == 0 {
			for _, w := range candidates {
				if w.ID == id && w.Available() {
					req.Decision = policy.Decision{Worker: w.ID, Branch: BranchPreviousResponse}
					s.metrics.selected(polName, req.Model, w)
					if tr != nil {
						tr.Decision(1, polName, w.ID, BranchPreviousResponse, 0, false)
					}
					return w
				}
			}
		}
		return next(tried)
	}
}

// responseIDWriter relays a Responses answer and remembers its response id with the worker that
// gave it, read from the answer's first bytes before they are relayed: a client that sends its
// follow-up the moment it reads the id finds it remembered.
type responseIDWriter struct {
	http.ResponseWriter
	remember func(id, workerID string)
	// worker is the worker picked last: the proxy picks on the goroutine that writes, and only
	// the attempt whose answer is relayed writes.
	worker *worker.Worker
	status int
	head   []byte
	done   bool // the id was found, or cannot be any more
}

func (r *responseIDWriter) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *responseIDWriter) Write(b []byte) (int, error) {
	if !r.done {
		r.look(b)
	}
	return r.ResponseWriter.Write(b)
}

// look adds b to the head kept and remembers the response id once the head holds it.
func (r *responseIDWriter) look(b []byte) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.status != http.StatusOK || r.worker == nil {
		r.done = true
		return
	}
	if r.head == nil {
		r.head = make([]byte, 0, min(responseHeadMax, max(len(b), 512)))
	}
	r.head = append(r.head, b[:min(responseHeadMax-len(r.head), len(b))]...)
	if id := responseID(r.head); id != "" {
		r.remember(id, r.worker.ID)
		r.done = true
		return
	}
	r.done = len(r.head) >= responseHeadMax
}

// Flush flushes the client connection (every streamed event is flushed).
func (r *responseIDWriter) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (r *responseIDWriter) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// responseID finds the response id at the start of a Responses answer: the top-level "id" of a
// JSON body, or the "id" of the "response" object of a stream's first data line. "" when there
// is none, or it is too long or not printable.
func responseID(head []byte) string {
	var doc []byte
	if i := bytes.Index(head, []byte("data:")); i >= 0 && (i == 0 || head[i-1] == '\n') && !bytes.HasPrefix(bytes.TrimLeft(head, " \t\r\n"), []byte("{")) {
		doc = head[i+len("data:"):]
		if j := bytes.IndexByte(doc, '\n'); j >= 0 {
			doc = doc[:j]
		}
		return validResponseID(jsonMemberString(doc, "response", "id"))
	}
	return validResponseID(jsonMemberString(head, "id"))
}

func validResponseID(id string) string {
	if id == "" || len(id) > responseIDMax || !printable(id) {
		return ""
	}
	return id
}

// jsonMemberString returns the string at the path of object keys in doc (which may be cut
// short: what was read before the cut counts), or "" when the path is not reached or does not
// hold a string. The first of duplicate keys wins.
func jsonMemberString(doc []byte, path ...string) (out string) {
	sc := jsonscan.New(doc)
	var walk func(depth int)
	walk = func(depth int) {
		sc.Object(func(key []byte) {
			switch {
			case out != "" || string(key) != path[depth]:
				sc.Skip()
			case depth == len(path)-1 && sc.Peek() == '"':
				out = string(sc.Str(true))
			case depth < len(path)-1 && sc.Peek() == '{':
				walk(depth + 1)
			default:
				sc.Skip()
			}
		})
	}
	if sc.Peek() == '{' {
		walk(0)
	}
	return out
}

// forwardResponses forwards a Responses request: a follow-up turn goes back to the worker that
// answered the turn it follows (responsePicker), and the id of the response a worker gives is
// remembered with that worker (responseIDWriter).
func (s *Server) forwardResponses(ctx context.Context, aw *auditWriter, fr *proxy.Request, pick proxy.Picker, candidates []*worker.Worker, p *Parsed, req *policy.Request, polName string, tr *tracing.Request) proxy.Result {
	if p.PreviousResponseID != "" {
		pick = s.responsePicker(pick, candidates, p.PreviousResponseID, req, polName, tr)
	}
	rw := &responseIDWriter{ResponseWriter: aw, remember: s.rememberResponse}
	return s.fwd.Forward(ctx, rw, fr, func(tried []*worker.Worker) *worker.Worker {
		rw.worker = pick(tried)
		return rw.worker
	})
}
