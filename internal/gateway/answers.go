package gateway

import (
	"bytes"
	"log/slog"
	"sync"

	"github.com/kvgate/kvgate/internal/jsonscan"
	"github.com/kvgate/kvgate/internal/policy"
)

// Learning from the answers (policy.AnswerLearner). Every answer that reports how much of its
// prompt the engine reused (usage.prompt_tokens_details.cached_tokens; SGLang's
// meta_info.cached_tokens on /generate) is handed, with the decision that sent it, to the
// policy, which corrects its picture of that worker's cache.
//
// Streams report usage only when asked: for a streamed chat or completions request whose body
// has no stream_options, the gateway asks for it (stream_options.include_usage: true) and
// removes the usage-only chunk (an empty "choices" and a "usage" object) from what the client
// sees, so that neither the OpenAI SDKs nor a reader of choices[0] notices. A client that set
// stream_options itself gets exactly what it asked for. The other chunks carry "usage": null
// when asked this way, which every OpenAI client reads as no usage.

// includeUsage is what is added at the start of a streamed body that has no stream_options.
var includeUsage = []byte(`"stream_options":{"include_usage":true},`)

// askUsage returns body with stream_options.include_usage set when the body is a JSON object
// without stream_options, ok false (and body unchanged) otherwise. The new body is one copy of
// the old with the member added first: a later duplicate cannot exist, since there was none.
func askUsage(body []byte) ([]byte, bool) {
	i := 0
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n') {
		i++
	}
	if i >= len(body) || body[i] != '{' || hasStreamOptions(body) {
		return body, false
	}
	rest := bytes.TrimLeft(body[i+1:], " \t\r\n")
	if len(rest) == 0 || rest[0] == '}' {
		return body, false // an empty object names no model: it is refused before this
	}
	out := make([]byte, 0, len(body)+len(includeUsage))
	out = append(out, body[:i+1]...)
	out = append(out, includeUsage...)
	out = append(out, body[i+1:]...)
	return out, true
}

// hasStreamOptions reports whether the top-level object of body has a stream_options member, or
// whether body is not one well-formed object (then it must not be touched).
func hasStreamOptions(body []byte) bool {
	sc := jsonscan.NewShallow(body)
	found := false
	sc.Object(func(key []byte) {
		if jsonscan.KeyIs(key, "stream_options") {
			found = true
		}
		sc.Skip()
	})
	return found || sc.Err() != nil
}

// isUsageOnlyEvent reports whether the SSE event ev (its whole text, lines and all) is an
// OpenAI usage-only chunk: one data line holding an object whose "choices" is an empty array
// and whose "usage" is an object.
func isUsageOnlyEvent(ev []byte) bool {
	if !bytes.Contains(ev, []byte(`"usage"`)) {
		return false
	}
	var data []byte
	for line := range bytes.Lines(ev) {
		line = bytes.TrimRight(line, "\r\n")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				return false // several data lines: not a chunk the gateway asked for
			}
			data = bytes.TrimLeft(d, " ")
		}
	}
	if data == nil {
		return false
	}
	sc := jsonscan.NewShallow(data)
	emptyChoices, usage := false, false
	sc.Object(func(key []byte) {
		switch {
		case jsonscan.KeyIs(key, "choices"):
			n := 0
			sc.Array(func() { n++; sc.Skip() })
			emptyChoices = n == 0
		case jsonscan.KeyIs(key, "usage"):
			usage = sc.Peek() == '{'
			sc.Skip()
		default:
			sc.Skip()
		}
	})
	return sc.Err() == nil && emptyChoices && usage
}

// dropUsageEvents returns b without its usage-only events, when b is whole events (the relay
// writes whole events); b itself when there is nothing to drop.
func dropUsageEvents(b []byte) []byte {
	if !bytes.Contains(b, []byte(`"usage"`)) {
		return b
	}
	var out []byte
	start := 0
	for start < len(b) {
		n := eventLen(b[start:])
		if n == 0 {
			break // a partial event: pass it through as it is
		}
		ev := b[start : start+n]
		if isUsageOnlyEvent(ev) {
			if out == nil {
				out = make([]byte, 0, len(b))
				out = append(out, b[:start]...)
			}
		} else if out != nil {
			out = append(out, ev...)
		}
		start += n
	}
	if out == nil {
		return b
	}
	return append(out, b[start:]...)
}

// eventLen returns the length of the first SSE event of b up to and including the blank line
// that ends it, 0 when b holds no whole event.
func eventLen(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 3
		}
	}
	return 0
}

// answerTokens reads the prompt and cached tokens an answer reported: the last OpenAI or
// Responses usage in b, else SGLang's meta_info (prompt_tokens, cached_tokens). ok false when
// neither reports cached tokens for a positive prompt.
func answerTokens(b []byte) (prompt, cached int, ok bool) {
	if u, ok := usageIn(b); ok && u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
		return u.PromptTokens, *u.PromptTokensDetails.CachedTokens, true
	}
	i := bytes.LastIndex(b, []byte(`"meta_info"`))
	if i < 0 {
		return 0, 0, false
	}
	rest := bytes.TrimLeft(b[i+len(`"meta_info"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return 0, 0, false
	}
	sc := jsonscan.New(rest[1:])
	var hasCached bool
	sc.Object(func(key []byte) {
		switch {
		case jsonscan.KeyIs(key, "prompt_tokens"):
			v, _ := sc.Int()
			prompt = int(min(max(v, 0), 1<<40))
		case jsonscan.KeyIs(key, "cached_tokens"):
			v, _ := sc.Int()
			cached, hasCached = int(min(max(v, 0), 1<<40)), true
		default:
			sc.Skip()
		}
	})
	if sc.Err() != nil || !hasCached || prompt <= 0 {
		return 0, 0, false
	}
	return prompt, cached, true
}

// silentWorkers remembers the workers whose answers reported no cached tokens, to say so once
// each in the log: their answers leave the policy's picture as it was. It remembers too each
// worker's events-index drift state (policy.DriftReporter), to log its transitions once each.
type silentWorkers struct {
	mu    sync.Mutex
	seen  map[string]bool
	drift map[string]policy.Drift
}

// noteDrift logs worker's drift state when it changed since the last answer noted.
func (s *silentWorkers) noteDrift(log *slog.Logger, worker string, d policy.Drift) {
	s.mu.Lock()
	if s.drift == nil {
		s.drift = map[string]policy.Drift{}
	}
	last, known := s.drift[worker]
	changed := last != d && (known || d != policy.Drift{})
	if changed && (known || len(s.drift) < maxSilentWorkers) {
		s.drift[worker] = d
	}
	s.mu.Unlock()
	if !changed || log == nil {
		return
	}
	if d.Drifting {
		log.Warn("kv events: a worker's events index disagrees with what its answers report cached; its requests are scored by the prefix tree until they agree again",
			"worker", worker, "times", d.Count)
	} else {
		log.Info("kv events: a worker's events index agrees with its answers again", "worker", worker)
	}
}

// maxSilentWorkers bounds what silentWorkers remembers (worker ids come from the registry).
const maxSilentWorkers = 4096

// note logs, the first time for worker, that its answers report no cached tokens.
func (s *silentWorkers) note(log *slog.Logger, worker, model string) {
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	first := !s.seen[worker] && len(s.seen) < maxSilentWorkers
	if first {
		s.seen[worker] = true
	}
	s.mu.Unlock()
	if first && log != nil {
		log.Info("a worker's answers report no cached tokens: routing will not learn from them (vLLM needs --enable-prompt-tokens-details)",
			"worker", worker, "model", model)
	}
}

// learn hands the answer's cached tokens to the policy, if it learns from them.
func (a *auditWriter) learn(prompt, cached int) {
	if a.learner == nil || a.req.Decision.Worker == "" {
		return
	}
	w := a.req.Decision.Worker
	a.learner.Learn(a.req, policy.Answer{Worker: w, PromptTokens: prompt, CachedTokens: cached})
	if dr, ok := a.learner.(policy.DriftReporter); ok && a.silent != nil && a.req.Decision.Basis.Evented {
		a.silent.noteDrift(a.log, w, dr.WorkerDrift(w))
	}
}

// learnFrom sets up aw to hand the answer to pol, if pol learns from answers, and returns the
// body to forward: for a streamed chat or completions request without stream_options, one that
// asks for usage (the usage chunk is then removed from what the client sees). ref is false when
// the body is a new one, which the request's pooled buffer no longer backs.
func (s *Server) learnFrom(aw *auditWriter, pol policy.Policy, kind routeKind, stream bool, body []byte) (_ []byte, ref bool) {
	l, ok := policy.As[policy.AnswerLearner](pol)
	if !ok {
		return body, true
	}
	aw.learner, aw.silent, aw.log = l, &s.silentWorkers, s.log
	if !stream || kind != kindChat && kind != kindCompletion {
		return body, true
	}
	nb, asked := askUsage(body)
	if !asked {
		return body, true
	}
	aw.stripUsage = true
	return nb, false
}
