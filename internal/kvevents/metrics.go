package kvevents

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Service's and a Tokenizer's counters to Prometheus at scrape time.
type Collector struct {
	svc *Service
	tok *Tokenizer
}

// NewCollector returns a collector of s and t (t may be nil).
func NewCollector(s *Service, t *Tokenizer) *Collector { return &Collector{svc: s, tok: t} }

var (
	descMessages = prometheus.NewDesc("kvgate_kv_events_messages_total",
		"KV-cache event messages by outcome: applied, malformed, unknown_topic (names no registered worker), rejected (from a publisher not on the worker's host), dropped (a full queue or receive budget).",
		[]string{"outcome"}, nil)
	descGaps = prometheus.NewDesc("kvgate_kv_events_gaps_total",
		"Sequence gaps by resolution: replayed (filled from the replay socket), resync (the worker's picture dropped until rebuilt).",
		[]string{"resolution"}, nil)
	descRestarts = prometheus.NewDesc("kvgate_kv_events_publisher_restarts_total",
		"Publishers seen starting over (sequence 0, or a new connection below the last sequence).", nil, nil)
	descBuffered = prometheus.NewDesc("kvgate_kv_events_buffered_bytes",
		"Bytes of event frames being received and of messages waiting to be applied (bounded by the receive budget).", nil, nil)
	descBlocks = prometheus.NewDesc("kvgate_kv_events_index_blocks",
		"KV blocks the event index holds, over all event streams.", nil, nil)
	descStreams = prometheus.NewDesc("kvgate_kv_events_index_streams",
		"Event streams (worker, model, data-parallel rank) the index knows.", nil, nil)
	descIndexDrops = prometheus.NewDesc("kvgate_kv_events_index_drops_total",
		"Blocks the index dropped: bound (over the per-worker bound), orphan (stored under an unknown parent).",
		[]string{"reason"}, nil)
	descTokenize = prometheus.NewDesc("kvgate_tokenize_requests_total",
		"Tokenizations for precise routing by outcome: cache_hit, worker (asked a worker's /tokenize), failed.",
		[]string{"outcome"}, nil)
)

// Describe sends the descriptors.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMessages, descGaps, descRestarts, descBuffered, descBlocks, descStreams, descIndexDrops, descTokenize} {
		ch <- d
	}
}

// Collect sends the current values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.svc.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descMessages, s.Batches, "applied")
	counter(descMessages, s.Malformed, "malformed")
	counter(descMessages, s.Unknown, "unknown_topic")
	counter(descMessages, s.Rejected, "rejected")
	counter(descMessages, s.Dropped, "dropped")
	counter(descGaps, s.Replayed, "replayed")
	counter(descGaps, s.Resyncs, "resync")
	counter(descRestarts, s.Restarts)
	ch <- prometheus.MustNewConstMetric(descBuffered, prometheus.GaugeValue, float64(s.Buffered))
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(s.Index.Blocks))
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(s.Index.Sources))
	counter(descIndexDrops, s.Index.Evicted, "bound")
	counter(descIndexDrops, s.Index.Orphans, "orphan")
	if c.tok != nil {
		t := c.tok.Stats()
		counter(descTokenize, t.Hits, "cache_hit")
		counter(descTokenize, t.Misses-t.Failures, "worker")
		counter(descTokenize, t.Failures, "failed")
	}
}

var _ prometheus.Collector = (*Collector)(nil)
