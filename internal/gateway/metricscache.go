package gateway

import (
	"maps"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// hotMetric names a metric that every routed request updates.
type hotMetric uint8

const (
	hotRequests    hotMetric = iota // kvgate_requests_total{route, model, status}
	hotDuration                     // kvgate_request_duration_seconds{route, model}
	hotTTFT                         // kvgate_ttft_seconds{model}
	hotSelections                   // kvgate_policy_selections_total{policy, model, worker}
	hotPredError                    // kvgate_prefix_prediction_error{policy, model}
	hotPredMissing                  // kvgate_prefix_prediction_unverified_total{policy, model}
	hotPredTTFT                     // kvgate_route_predicted_ttft_seconds{worker}
	hotTTFTError                    // kvgate_route_ttft_error_seconds{worker}
)

// hotKey names one child of a hot metric by its label values. Model and worker have fields of
// their own, so that forgetting a model or a worker finds its children.
type hotKey struct {
	metric hotMetric
	label  string // route (requests, duration) or policy (selections, prediction)
	model  string
	worker string // selections, predicted TTFT and its error only
	status int    // requests only
}

// hotChild is a cached child: a counter or an observer, as its metric is.
type hotChild struct {
	counter  prometheus.Counter
	observer prometheus.Observer
}

// maxHotChildren bounds the cache. Its keys are as bounded as the series themselves (served
// models, registered workers, routes, statuses), but a cache is copied whole on each miss: past
// this size a miss is served from the vec without caching.
const maxHotChildren = 4096

// hotCache remembers the children of the hot metrics, so that a request finds each with one
// lookup in an immutable map instead of hashing its label values into a vec under the vec's
// lock. A miss creates the child under mu, which forgetModel and forgetWorker also hold while
// they delete series and drop their children from the cache: a child is never cached after its
// series was deleted, so no request counts into a series that no scrape shows. (A request that
// looked its child up just before a forget counts into that deleted child, as it would have
// counted into the series the forget was about to delete.)
type hotCache struct {
	mu       sync.Mutex
	children atomic.Pointer[map[hotKey]hotChild]
}

// child returns the child of m named by k, creating it on first use.
func (m *Metrics) child(k hotKey) hotChild {
	if c, ok := (*m.hot.children.Load())[k]; ok {
		return c
	}
	m.hot.mu.Lock()
	defer m.hot.mu.Unlock()
	old := *m.hot.children.Load()
	if c, ok := old[k]; ok {
		return c
	}
	c := m.newChild(k)
	if len(old) < maxHotChildren {
		next := make(map[hotKey]hotChild, len(old)+1)
		maps.Copy(next, old)
		next[k] = c
		m.hot.children.Store(&next)
	}
	return c
}

// newChild gets k's child from its vec.
func (m *Metrics) newChild(k hotKey) hotChild {
	switch k.metric {
	case hotRequests:
		return hotChild{counter: m.requests.WithLabelValues(k.label, k.model, strconv.Itoa(k.status))}
	case hotDuration:
		return hotChild{observer: m.duration.WithLabelValues(k.label, k.model)}
	case hotTTFT:
		return hotChild{observer: m.ttft.WithLabelValues(k.model)}
	case hotSelections:
		return hotChild{counter: m.selections.WithLabelValues(k.label, k.model, k.worker)}
	case hotPredError:
		return hotChild{observer: m.predictionError.WithLabelValues(k.label, k.model)}
	case hotPredMissing:
		return hotChild{counter: m.predictionMissing.WithLabelValues(k.label, k.model)}
	case hotPredTTFT:
		return hotChild{observer: m.predictedTTFT.WithLabelValues(k.worker)}
	case hotTTFTError:
		return hotChild{observer: m.ttftError.WithLabelValues(k.worker)}
	}
	panic("gateway: unknown hot metric " + strconv.Itoa(int(k.metric)))
}

// forgetHot runs del (which deletes series) and drops the cached children for which gone says
// so, under the cache's lock.
func (m *Metrics) forgetHot(del func(), gone func(hotKey) bool) {
	m.hot.mu.Lock()
	defer m.hot.mu.Unlock()
	del()
	next := maps.Clone(*m.hot.children.Load())
	maps.DeleteFunc(next, func(k hotKey, _ hotChild) bool { return gone(k) })
	m.hot.children.Store(&next)
}
