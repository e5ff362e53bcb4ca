package loadmon

import (
	"time"

	"github.com/kvgate/kvgate/internal/worker"
)

// Pinned is one snapshot read at one instant: every Sample through it sees the same
// publication and the same clock reading, so a routing decision that compares many workers never
// mixes two polling rounds. It is a small value; the zero value reports nothing fresh.
type Pinned struct {
	snap  *Snapshot
	mode  Mode
	stale time.Duration
	now   time.Time
}

// Pin returns the current snapshot pinned at the monitor's clock now.
func (m *Monitor) Pin() Pinned {
	return Pinned{snap: m.snap.Load(), mode: m.cfg.Mode, stale: m.cfg.StaleAfter, now: m.cfg.Now()}
}

// Sample returns w's effective load (Monitor.Load) and its fresh report (Monitor.Report) from the
// pinned snapshot, with one lookup.
func (p Pinned) Sample(w *worker.Worker) (load int64, r Report, fresh bool) {
	local := w.Inflight()
	if p.snap != nil {
		if e, ok := p.snap.entries[w.ID]; ok && e.Age(p.now) <= p.stale {
			r, fresh = e.Report, true
		}
	}
	return Effective(p.mode, local, r, fresh), r, fresh
}

// Report returns w's fresh report from the pinned snapshot (Monitor.Report), with one lookup and
// without computing its effective load.
func (p Pinned) Report(w *worker.Worker) (r Report, fresh bool) {
	if p.snap != nil {
		if e, ok := p.snap.entries[w.ID]; ok && e.Age(p.now) <= p.stale {
			return e.Report, true
		}
	}
	return Report{}, false
}

// Snapshot returns the pinned snapshot; nil for the zero Pinned. A snapshot never changes once
// published, so a caller may keep what it read from one for as long as Snapshot returns the same
// pointer.
func (p Pinned) Snapshot() *Snapshot { return p.snap }

// Fresh reports whether a report of the pinned snapshot polled at polledAt is fresh at the pinned
// instant (as Report decides it); always false for the zero Pinned.
func (p Pinned) Fresh(polledAt time.Time) bool {
	return p.snap != nil && p.now.Sub(polledAt) <= p.stale
}
