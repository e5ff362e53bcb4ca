package gateway

import (
	"bytes"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/policy"
)

// Audit of routing decisions. Every request the gateway routes carries a decision record
// (policy.Decision: worker, branch, predicted cached share). Two things are done with it:
//
//   - With Config.AuditHeaders on (off by default), the response of a request that carries the
//     admin key or a key named in Config.AuditHeadersClients carries it as headers:
//     x-kvgate-worker (an opaque keyed hash of the worker id), x-kvgate-route (policy/branch)
//     and, when the policy predicted one, x-kvgate-predicted-hit (the share of the prompt it
//     expected cached, in tenths). auditaccess.go says why no other client sees them.
//   - Always, when the policy predicted a share, the share the worker then reports
//     (usage.prompt_tokens / usage.prompt_tokens_details.cached_tokens) is compared with it and
//     the difference is observed in kvgate_prefix_prediction_error. The response is never
//     buffered for this: a non-streaming body is looked at only when it is small (the bytes
//     already relayed, up to auditBodyMax), a stream only through its last auditTailMax bytes,
//     where the usage chunk is.
const (
	headerWorker    = "X-Kvgate-Worker"
	headerRoute     = "X-Kvgate-Route"
	headerPredicted = "X-Kvgate-Predicted-Hit"
	// headerCost and headerCostRunnerUp carry the cost terms of the chosen worker and of the
	// runner-up (policy.Terms.String), for the cost-based policies.
	headerCost         = "X-Kvgate-Cost"
	headerCostRunnerUp = "X-Kvgate-Cost-Runner-Up"

	// auditBodyMax is the largest non-streaming body whose usage is read.
	auditBodyMax = 64 << 10
	// auditTailMax is how much of a stream's end is kept to find its usage chunk.
	auditTailMax = 4 << 10
)

// auditWriter relays a response to the client, adding the audit headers when asked, and keeps
// what it needs to read the usage afterwards.
type auditWriter struct {
	http.ResponseWriter
	req       *policy.Request
	textBytes int // the whole routing text's length in the body
	policy    string
	// ids, when not nil, turns on the audit headers: the request may see them.
	ids *auditIDs
	// observer, when the policy is one, hears the predicted and the reported share; learner,
	// when it is one, the answer's cached tokens (answers.go).
	observer policy.CacheObserver
	learner  policy.AnswerLearner
	// stripUsage: the gateway asked the stream for usage on the client's behalf, and removes
	// the usage-only chunk (answers.go).
	stripUsage bool
	// silent, when set, notes the workers whose answers report no cached tokens.
	silent *silentWorkers
	log    *slog.Logger

	status  int
	sse     bool
	keep    []byte  // non-streaming: the body so far; streaming: its tail
	keepBuf *[]byte // the pooled slice keep came from, handed back by finish
	dropped bool    // non-streaming body over auditBodyMax: not read
}

// newAuditWriter wraps w for req, whose routing text is textBytes long in the body, routed by
// the policy named policy; ids is nil unless the response may carry the audit headers. It is
// returned as a value for the caller to place (route keeps it with the rest of the request).
func newAuditWriter(w http.ResponseWriter, req *policy.Request, textBytes int, policy string, ids *auditIDs) auditWriter {
	return auditWriter{ResponseWriter: w, req: req, textBytes: textBytes, policy: policy, ids: ids}
}

// WriteHeader adds the audit headers (when on) from the decision of the last pick.
func (a *auditWriter) WriteHeader(code int) {
	if a.status != 0 {
		return
	}
	a.status = code
	h := a.Header()
	a.sse = strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
	if a.ids != nil {
		a.renderDecision(h)
	}
	a.ResponseWriter.WriteHeader(code)
}

// renderDecision writes the decision of the last pick into h as the audit headers: the one place
// that turns a policy.Decision into what a client sees (auditaccess.go says why each is shown as
// it is).
func (a *auditWriter) renderDecision(h http.Header) {
	d := &a.req.Decision
	if d.Worker == "" {
		return
	}
	h.Set(headerWorker, a.ids.of(d.Worker))
	route := a.policy
	if d.Branch != "" {
		route += "/" + d.Branch
	}
	h.Set(headerRoute, route)
	if d.HasPrediction {
		h.Set(headerPredicted, strconv.FormatFloat(roundTenth(a.promptShare()), 'f', 1, 64))
	}
	if d.HasCost {
		h.Set(headerCost, a.ids.terms(d.Chosen).String())
		if d.RunnerUp.Worker != "" {
			h.Set(headerCostRunnerUp, a.ids.terms(d.RunnerUp).String())
		}
	}
}

// Write relays b, keeping the body (small, non-streaming) or the stream's tail.
func (a *auditWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if a.keep == nil {
		a.keepBuf = auditBufs.Get().(*[]byte)
		a.keep = (*a.keepBuf)[:0]
	}
	switch {
	case a.sse:
		if len(b) >= auditTailMax {
			a.keep = append(a.keep[:0], b[len(b)-auditTailMax:]...)
			break
		}
		if len(a.keep)+len(b) > 2*auditTailMax {
			// Shift once the buffer holds two windows: amortised, each byte moves at most once.
			n := copy(a.keep, a.keep[len(a.keep)-auditTailMax:])
			a.keep = a.keep[:n]
		}
		a.keep = append(a.keep, b...)
	case !a.dropped:
		if len(a.keep)+len(b) > auditBodyMax {
			a.keep, a.dropped = a.keep[:0], true
			break
		}
		a.keep = append(a.keep, b...)
	}
	if a.sse && a.stripUsage {
		if out := dropUsageEvents(b); len(out) != len(b) {
			if _, err := a.ResponseWriter.Write(out); err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	return a.ResponseWriter.Write(b)
}

// Flush flushes the client connection (the proxy flushes every streamed event).
func (a *auditWriter) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (a *auditWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// auditUsage is the part of an OpenAI usage object the audit reads.
type auditUsage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	PromptTokensDetails *auditDetails `json:"prompt_tokens_details"`
}

// auditDetails is the part of usage.prompt_tokens_details the audit reads.
type auditDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

// answered returns the prompt and cached tokens the worker reported, from the last usage (or
// /generate's meta_info) in what was kept; ok false when there is none or it lacks
// cached_tokens.
func (a *auditWriter) answered() (prompt, cached int, ok bool) {
	if a.status != http.StatusOK || a.dropped || len(a.keep) == 0 {
		return 0, 0, false
	}
	return answerTokens(a.keep)
}

// usageShare finds the last `"usage":` in b and returns the cached share of the prompt it reports.
func usageShare(b []byte) (float64, bool) {
	u, ok := usageIn(b)
	if !ok || u.PromptTokens <= 0 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == nil {
		return 0, false
	}
	c := *u.PromptTokensDetails.CachedTokens
	return min(max(float64(c)/float64(u.PromptTokens), 0), 1), true
}

// usageValue returns what follows the last `"usage":` in b.
func usageValue(b []byte) ([]byte, bool) {
	i := lastIndexUsage(b)
	if i < 0 {
		return nil, false
	}
	rest := bytes.TrimLeft(b[i+len(`"usage"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil, false
	}
	return rest[1:], true
}

// lastIndexUsage is bytes.LastIndex(b, `"usage"`), found with forward searches: those are
// vectorised where LastIndex compares byte by byte, and a body holds the key at most a few times.
func lastIndexUsage(b []byte) int {
	last := -1
	for off := 0; ; {
		i := bytes.Index(b[off:], []byte(`"usage"`))
		if i < 0 {
			return last
		}
		last = off + i
		off = last + 1
	}
}

// usageIn reads the object after the last `"usage":` in b: an OpenAI usage (prompt_tokens,
// prompt_tokens_details), or else a Responses API one (input_tokens, input_tokens_details).
func usageIn(b []byte) (auditUsage, bool) {
	v, ok := usageValue(b)
	if !ok {
		return auditUsage{}, false
	}
	if u, ok := scanUsage(v, "prompt_tokens", "prompt_tokens_details"); ok {
		return u, true
	}
	return scanUsage(v, "input_tokens", "input_tokens_details")
}

// scanUsage reads the usage object v with the prompt's token count and details under the given
// keys.
func scanUsage(v []byte, tokensKey, detailsKey string) (auditUsage, bool) {
	var u auditUsage
	var (
		sc                   = jsonscan.New(v)
		cached               int
		hasDetails, hasCache bool
	)
	// The fields are read as encoding/json reads them into auditUsage: keys match
	// case-insensitively, the last duplicate wins, null leaves an int as it was and clears a
	// pointer, and a value of the wrong kind spoils the whole object.
	integer := func() int {
		v, ok := sc.Int()
		if ok && int64(int(v)) != v {
			sc.Fail("integer out of range")
		}
		return int(v)
	}
	sc.Object(func(key []byte) {
		switch {
		case jsonscan.KeyIs(key, tokensKey):
			if !sc.Null() {
				u.PromptTokens = integer()
			}
		case jsonscan.KeyIs(key, detailsKey):
			if sc.Null() {
				hasDetails, hasCache = false, false
				return
			}
			if !hasDetails {
				hasDetails, hasCache = true, false
			}
			sc.Object(func(key []byte) {
				switch {
				case !jsonscan.KeyIs(key, "cached_tokens"):
					sc.Skip()
				case sc.Null():
					hasCache = false
				default:
					cached, hasCache = integer(), true
				}
			})
		default:
			sc.Skip()
		}
	})
	if sc.Err() != nil {
		return auditUsage{}, false
	}
	if hasDetails {
		u.PromptTokensDetails = &auditDetails{}
		if hasCache {
			u.PromptTokensDetails.CachedTokens = &cached
		}
	}
	return u, u.PromptTokens > 0
}

// usage returns the usage the worker reported in what was kept of a successful response.
func (a *auditWriter) usage() (auditUsage, bool) {
	if a.status != http.StatusOK || a.dropped || len(a.keep) == 0 {
		return auditUsage{}, false
	}
	return usageIn(a.keep)
}

// promptShare is the decision's prediction for the whole prompt (policy.PromptShare).
func (a *auditWriter) promptShare() float64 {
	if a.req.Decision.WholePrompt {
		return a.req.Decision.Predicted
	}
	return policy.PromptShare(a.req.Decision.Predicted, len(a.req.Text), a.textBytes)
}

// auditBufs recycles the buffers that hold a stream's tail or a small body: one per request in
// flight, sized for a stream's two windows.
var auditBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2*auditTailMax); return &b }}

// finish observes the prediction of a request relayed whole (ok), or of a stream the worker
// finished, and recycles the buffer.
func (a *auditWriter) finish(m *Metrics, model string, ok bool) {
	// A stream whose worker sent its end ([DONE]) was answered whole even when the client hung up
	// before the relay finished (SDKs close the body at [DONE]): its usage is as good to learn from.
	if ok || a.sse && a.status == http.StatusOK && bytes.Contains(a.keep, []byte("data: [DONE]")) {
		a.observe(m, model)
	}
	if a.keep != nil && cap(a.keep) <= 4*auditTailMax {
		*a.keepBuf = a.keep[:0]
		auditBufs.Put(a.keepBuf)
	}
	a.keep, a.keepBuf = nil, nil
}

// observe compares the decision's prediction with what the worker reported, once the response
// is relayed.
func (a *auditWriter) observe(m *Metrics, model string) {
	d := &a.req.Decision
	if !d.HasPrediction {
		return
	}
	prompt, cached, ok := a.answered()
	if !ok {
		m.child(hotKey{metric: hotPredMissing, label: a.policy, model: model}).counter.Inc()
		if a.silent != nil && a.status == http.StatusOK && !a.dropped {
			a.silent.note(a.log, d.Worker, model)
		}
		return
	}
	actual := min(max(float64(cached)/float64(prompt), 0), 1)
	a.learn(prompt, cached)
	predicted := a.promptShare()
	m.child(hotKey{metric: hotPredError, label: a.policy, model: model}).observer.Observe(predicted - actual)
	if a.observer != nil {
		a.observer.Observed(predicted, actual)
	}
}

// predictionErrorBuckets cover predicted − actual share in [−1, 1], finer near zero.
var predictionErrorBuckets = []float64{-1, -0.75, -0.5, -0.25, -0.1, -0.05, -0.01, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1}

// auditMetrics are the audit's metrics, registered by newMetrics.
func auditMetrics() (*prometheus.HistogramVec, *prometheus.CounterVec) {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_prefix_prediction_error",
			Help:    "Predicted minus worker-reported cached share of the prompt, per routed request whose policy predicted one and whose worker reported cached_tokens.",
			Buckets: predictionErrorBuckets,
		}, []string{"policy", "model"}),
		prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_prefix_prediction_unverified_total",
			Help: "Requests with a predicted cached share whose response gave no cached_tokens to compare (no usage, a large body, an error).",
		}, []string{"policy", "model"})
}
