package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/policy"
)

// DefaultSessionHeaders are the session headers read when Config.SessionHeaders is empty: the
// ones clients and proxies in front of inference servers commonly set per conversation.
var DefaultSessionHeaders = []string{"X-Session-Id", "X-Conversation-Id"}

// sessionKeys returns the request's session key (policy.Request.Key, which consistent_hashing
// hashes and sticky sessions bind) and its affinity key (policy.Request.Affinity, the placement
// key the cost policies give a conversation). The first that is set wins:
//
//  1. the X-Kvgate-Routing-Key header;
//  2. a session header (Config.SessionHeaders, in their order);
//  3. the body's "prompt_cache_key";
//  4. the body's "conversation";
//  5. the X-User-Id header, then the body's "user".
//
// The last two name a user, who may hold many conversations at once, so they are a session key
// but no affinity key: placing all of a user's conversations by one hash would pile them on one
// worker. The affinity key is the session key's source prefixed, so that a routing key and a
// prompt_cache_key of the same text stay apart. The policies bound what they keep of either
// (policy.MaxKeyBytes, and a hash), so a hostile value costs no memory; it only chooses a
// worker, which any client may do by its prompt anyway.
func (s *Server) sessionKeys(h http.Header, p *Parsed) (key, affinity string) {
	if k := h.Get("X-Kvgate-Routing-Key"); k != "" {
		return k, "h\x00" + k
	}
	for _, name := range s.sessionHeaders {
		if k := h.Get(name); k != "" {
			return k, "h\x00" + k
		}
	}
	switch {
	case p.PromptCacheKey != "":
		return p.PromptCacheKey, "k\x00" + p.PromptCacheKey
	case p.Conversation != "":
		return p.Conversation, "c\x00" + p.Conversation
	}
	if k := h.Get("X-User-Id"); k != "" {
		return k, ""
	}
	return p.User, ""
}

var (
	descSessions       = prometheus.NewDesc("kvgate_sticky_sessions", "Sticky sessions bound now.", []string{"policy", "model"}, nil)
	descSessionsEnded  = prometheus.NewDesc("kvgate_sticky_sessions_ended_total", "Sticky sessions dropped, by reason: expired (TTL of silence) or evicted (table full, least recently used).", []string{"policy", "model", "reason"}, nil)
	descSessionsOpened = prometheus.NewDesc("kvgate_sticky_sessions_created_total", "Sticky sessions bound for the first time (or again after they ended).", []string{"policy", "model"}, nil)
)

// sessionCollector reads the sticky session tables at scrape time.
type sessionCollector struct{ router *policy.Router }

func (c sessionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSessions
	ch <- descSessionsEnded
	ch <- descSessionsOpened
}

func (c sessionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, pp := range c.router.Policies() {
		p, model := pp.Policy, pp.Label()
		sr, ok := p.(policy.SessionReporter)
		if !ok {
			continue
		}
		st := sr.Sessions()
		ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(st.Active), p.Name(), model)
		ch <- prometheus.MustNewConstMetric(descSessionsOpened, prometheus.CounterValue, float64(st.Created), p.Name(), model)
		ch <- prometheus.MustNewConstMetric(descSessionsEnded, prometheus.CounterValue, float64(st.Expired), p.Name(), model, "expired")
		ch <- prometheus.MustNewConstMetric(descSessionsEnded, prometheus.CounterValue, float64(st.Evicted), p.Name(), model, "evicted")
	}
}
