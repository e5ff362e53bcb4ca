package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/policy"
)

// sessionKey is the request's session identity (policy.Request.Key), which consistent_hashing
// hashes and sticky sessions bind: a routing-key or session header (routingKey), else the body's
// "user". The policies bound what they keep of it (policy.MaxKeyBytes), so a hostile value costs
// no memory; it only chooses a worker, which any client may do by its prompt anyway.
func sessionKey(h http.Header, p *Parsed) string {
	if k := routingKey(h); k != "" {
		return k
	}
	return p.User
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
