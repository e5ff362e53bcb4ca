package loadmon

import (
	"slices"
	"time"
)

// Source is where a worker's report came from. The zero value is SourceNone.
type Source uint8

const (
	// SourceNone: no source has answered yet.
	SourceNone Source = iota
	// SourceLoads is the native GET /v1/loads?include=core.
	SourceLoads
	// SourceMetrics is Prometheus GET /metrics.
	SourceMetrics
)

// String returns the source's path.
func (s Source) String() string {
	switch s {
	case SourceLoads:
		return "/v1/loads"
	case SourceMetrics:
		return "/metrics"
	}
	return "none"
}

// MarshalText makes a Source render as its path in JSON.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Entry is one worker's successful poll. Report.PolledAt is when the poll was sent and
// Report.InflightAtPoll this gateway's in-flight count for the worker at that moment.
type Entry struct {
	// Report is the load the worker reported.
	Report Report `json:"report"`
	// Source is the endpoint that answered.
	Source Source `json:"source"`
	// Runtime is the worker's runtime when it was polled ("" when unknown).
	Runtime string `json:"runtime,omitempty"`
	// Latency is how long the poll took, from send to parsed body (fallback attempts included).
	Latency time.Duration `json:"latency_ns"`
}

// Age returns how old the entry is at now.
func (e *Entry) Age(now time.Time) time.Duration { return now.Sub(e.Report.PolledAt) }

// Failure describes a worker whose last poll failed; such a worker has no Entry.
type Failure struct {
	// At is when the failed poll was sent.
	At time.Time `json:"at"`
	// Err is the poll's error.
	Err string `json:"error"`
	// Consecutive counts the failed polls in a row, this one included.
	Consecutive int `json:"consecutive"`
	// LastSuccess is when the last successful poll was sent; zero if none ever succeeded.
	LastSuccess time.Time `json:"last_success"`
}

// Snapshot is the load of every polled worker at one publication. It is immutable: the monitor
// publishes a new Snapshot, never changes one, so readers take no lock. A worker that was not
// polled (not ready, draining, just added) has neither an Entry nor a Failure.
type Snapshot struct {
	// At is when the snapshot was published; zero for the empty snapshot a Monitor starts with.
	At time.Time
	// Round numbers the polling rounds (1 for the first); zero for the empty snapshot.
	Round uint64
	// Took is how long the round took, first poll sent to last answer read.
	Took time.Duration
	// Polled is how many workers the round polled (each has an entry or a failure).
	Polled int

	entries  map[string]Entry
	failures map[string]Failure
}

// emptySnapshot is what a Monitor publishes before its first poll.
var emptySnapshot = &Snapshot{}

// Entry returns the entry of the worker with id, ok false when it has none. The entry may be
// stale: see Monitor.Fresh.
func (s *Snapshot) Entry(id string) (e Entry, ok bool) {
	e, ok = s.entries[id]
	return e, ok
}

// Failure returns why the worker's last poll failed, ok false when it did not fail.
func (s *Snapshot) Failure(id string) (f Failure, ok bool) {
	f, ok = s.failures[id]
	return f, ok
}

// Len returns the number of entries.
func (s *Snapshot) Len() int { return len(s.entries) }

// IDs returns the ids of the workers that have an entry, sorted.
func (s *Snapshot) IDs() []string {
	ids := make([]string, 0, len(s.entries))
	for id := range s.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// without returns a copy of s without the worker id; s itself if it holds nothing for id.
func (s *Snapshot) without(id string) *Snapshot {
	_, e := s.entries[id]
	_, f := s.failures[id]
	if !e && !f {
		return s
	}
	n := &Snapshot{At: s.At, Round: s.Round, Took: s.Took, Polled: s.Polled, entries: make(map[string]Entry, len(s.entries)), failures: make(map[string]Failure, len(s.failures))}
	for k, v := range s.entries {
		if k != id {
			n.entries[k] = v
		}
	}
	for k, v := range s.failures {
		if k != id {
			n.failures[k] = v
		}
	}
	return n
}
