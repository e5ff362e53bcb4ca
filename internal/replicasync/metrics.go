package replicasync

import "github.com/prometheus/client_golang/prometheus"

var (
	peersDesc = prometheus.NewDesc("kvgate_sync_peers",
		"Peer gateway replicas heard on the replica sync bus within the peer timeout.", nil, nil)
	messagesDesc = prometheus.NewDesc("kvgate_sync_messages_total",
		"Replica sync batches by direction (in, out) and outcome.", []string{"direction", "outcome"}, nil)
	recordsDesc = prometheus.NewDesc("kvgate_sync_records_total",
		"Records (decisions, finishes, bindings) applied from peers' batches.", nil, nil)
	lagDesc = prometheus.NewDesc("kvgate_sync_lag_seconds",
		"Age, measured at receipt, of the last batch from the least recently heard live peer (heartbeats keep it under a second when the bus is healthy).", nil, nil)
	upDesc = prometheus.NewDesc("kvgate_sync_active",
		"1 while the routing reads the peers' decisions, 0 while it routes on estimates (bus down, or every peer silent).", nil, nil)
)

// Collector exports a Node's counters on a Prometheus registry.
type Collector struct{ n *Node }

// NewCollector returns the Collector of n.
func NewCollector(n *Node) Collector { return Collector{n: n} }

var _ prometheus.Collector = Collector{}

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{peersDesc, messagesDesc, recordsDesc, lagDesc, upDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	st := n.Stats()
	ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(n.Peers()))
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, n.Lag().Seconds())
	active := 0.0
	if n.Active() {
		active = 1
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, active)
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.CounterValue, float64(st.Records.Load()))
	for _, m := range []struct {
		dir, outcome string
		v            uint64
	}{
		{"out", "published", st.Published.Load()},
		{"out", "dropped", st.Dropped.Load()},
		{"in", "applied", st.Applied.Load()},
		{"in", "duplicate", st.Duplicate.Load()},
		{"in", "lost", st.Gaps.Load()},
		{"in", "malformed", st.Malformed.Load()},
		{"in", "banned", st.Banned.Load()},
		{"in", "over_rate", st.OverRate.Load()},
		{"in", "over_peers", st.OverPeers.Load()},
		{"in", "slow_consumer", st.SlowConsumer.Load()},
	} {
		ch <- prometheus.MustNewConstMetric(messagesDesc, prometheus.CounterValue, float64(m.v), m.dir, m.outcome)
	}
}
