package gateway

import (
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/worker"
)

// A model's policy is never changed silently. The router tells the gateway of every policy a
// pool gets (policy.Router.OnChange), and the gateway logs it, by canonical name (an alias such
// as "rr" is logged as round_robin), with the worker whose policy label chose it:
//
//   - a new pool: INFO "model policy set", from the default (--policy) or from the label of the
//     worker that created it;
//   - a pool that already serves: WARN "model policy changed": a worker's label (an admin
//     registration, a discovery annotation, a --worker-label) switched it, or the last labelled
//     worker left and the pool went back to the default. The policy's state (prefix trees,
//     sticky sessions) starts over, so routing quality dips until it has learned again.
//
// A label that loses (the pool already follows an earlier worker's label) changes nothing and is
// logged at WARN when its worker registers (warnLabelNotApplied).

// policyChanged logs c.
func (s *Server) policyChanged(c policy.Change) {
	attrs := []any{"model", c.Model, "role", c.Role.String(), "policy", c.To}
	if c.From != "" {
		attrs = append(attrs, "from", c.From)
	}
	reason := "the default policy (--policy)"
	if c.Worker != nil {
		reason = "the policy label of worker " + c.Worker.ID
		attrs = append(attrs, "worker", c.Worker.ID, "url", c.Worker.Spec.URL, "registered_by", registeredBy(c.Worker))
	} else if c.From != "" {
		reason = "no worker of the model carries a policy label any more: back to the default (--policy)"
	}
	attrs = append(attrs, "reason", reason)
	if c.From == "" {
		s.log.Info("model policy set", attrs...)
		return
	}
	s.log.Warn("model policy changed; its routing state starts over", attrs...)
}

// warnLabelNotApplied logs a newly registered worker whose policy label names another policy than
// the one its pools keep: the first registered worker with a policy label chooses a pool's policy.
func (s *Server) warnLabelNotApplied(w *worker.Worker) {
	label := w.Label(policy.PolicyLabel)
	if label == "" {
		return
	}
	want, err := policy.Canonical(label)
	if err != nil {
		return // refused at admission; not reached
	}
	for _, m := range w.Spec.Models {
		if got, ok := s.router.InForce(m, w.Spec.Type); ok && got != want {
			s.log.Warn("worker's policy label not applied: the model keeps the policy chosen before it (the first registered worker with a policy label, else --policy)",
				"model", m, "role", w.Spec.Type.String(), "policy", got, "label", want, "worker", w.ID, "url", w.Spec.URL, "registered_by", registeredBy(w))
		}
	}
}

// registeredBy says what registered w: the operator (admin API or flags) or service discovery.
func registeredBy(w *worker.Worker) string {
	if w.Spec.Source != "" {
		return w.Spec.Source
	}
	return "operator"
}
