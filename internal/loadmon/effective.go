package loadmon

import (
	"fmt"
	"math"
	"strings"
)

// Mode selects how a worker's load is computed from this gateway's in-flight count and the
// worker's self-reported backlog. The zero value is ModeEffective.
//
// The modes other than ModeEffective exist so that the fleet simulator can measure the
// alternatives measured in the fleet simulator, side by side, with the same code the gateway runs.
type Mode uint8

const (
	// ModeEffective is the plain global-load formula:
	// max(local, backlog + (local − local_at_poll)). The snapshot is the shared truth across
	// gateway replicas; each replica corrects it with its own sends and completions since the poll,
	// so a burst right after a poll that said "idle" does not stampede one worker.
	ModeEffective Mode = iota
	// ModeLocal ignores the snapshot: this gateway's in-flight count only.
	ModeLocal
	// ModeSnapshot trusts the reported backlog alone while it is fresh, else local.
	ModeSnapshot
	// ModeMax is max(local, backlog) while the report is fresh, else local.
	ModeMax
	// ModeScaled is ModeEffective with the since-poll correction scaled by the estimated number
	// of gateway replicas: max(local, backlog + R × (local − local_at_poll)). Every replica reads
	// the same snapshot, so with plain ModeEffective they all see the same least-loaded worker
	// and pile onto it until the next poll; each replica sees only its own share (about 1/R) of
	// the sends since the poll. Scaling its own share by R estimates everyone's.
	ModeScaled
)

var modeNames = [...]string{ModeEffective: "effective", ModeLocal: "local", ModeSnapshot: "snapshot", ModeMax: "max", ModeScaled: "scaled"}

// String returns the mode's flag name.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses a flag value: "effective" (or ""), "scaled", "local", "snapshot" or "max".
func ParseMode(s string) (Mode, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	if n == "" {
		return ModeEffective, nil
	}
	for i, name := range modeNames {
		if n == name {
			return Mode(i), nil
		}
	}
	return ModeEffective, fmt.Errorf("unknown load mode %q (want effective, scaled, local, snapshot or max)", s)
}

// Effective returns a worker's load in requests under mode, from this gateway's in-flight count
// local and the worker's last report r, which counts only when fresh. It is pure (it reads no
// clock), so the fleet simulator computes load in virtual time with the gateway's own code.
//
// Without a fresh report every mode falls back to local. Sums saturate instead of overflowing.
func Effective(mode Mode, local int64, r Report, fresh bool) int64 {
	if !fresh || mode == ModeLocal {
		return local
	}
	backlog := r.Backlog()
	switch mode {
	case ModeSnapshot:
		return backlog
	case ModeMax:
		return max(local, backlog)
	case ModeScaled:
		rep := max(r.Replicas, 1)
		return max(local, satAdd(backlog, int64(math.Round(rep*float64(local-r.InflightAtPoll)))))
	default:
		// local − local_at_poll: requests this gateway sent (positive) or saw finish (negative)
		// since the poll. Both operands are non-negative counts, so the difference cannot overflow.
		return max(local, satAdd(backlog, local-r.InflightAtPoll))
	}
}

// MaxReplicas caps EstimateReplicas.
const MaxReplicas = 64

// EstimateReplicas estimates how many gateway replicas share a fleet's traffic from one poll
// round: the workers' reported backlog summed over the round, against this gateway's in-flight
// count at the poll summed over the same workers. With traffic spread evenly over R replicas the
// ratio is R; one is added to both sums so that an idle round says 1, and the result is clamped
// to [1, MaxReplicas]. Traffic that reaches the workers around the gateways raises the estimate,
// which makes the correction more cautious, not less.
func EstimateReplicas(backlog, inflightAtPoll int64) float64 {
	if backlog < 0 || inflightAtPoll < 0 {
		return 1
	}
	return min(max(float64(backlog+1)/float64(inflightAtPoll+1), 1), MaxReplicas)
}
