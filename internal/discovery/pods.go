package discovery

import (
	"net"
	"net/url"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvgate/kvgate/internal/worker"
)

// roles is the selector set in force: which pods are workers of which type, and on which ports.
// Immutable once published.
type roles struct {
	// regular, prefill and decode are nil when no pod takes that role.
	regular, prefill, decode labels.Selector
	// ports, when set, are the InferencePool's target ports: one worker per pod and port.
	ports []int
	// port and portName are the flags' port (used when ports is empty).
	port     int
	portName string
}

func rolesFromConfig(c *Config) *roles {
	r := &roles{port: c.Port, portName: c.PortName}
	sel := func(m map[string]string) labels.Selector {
		if len(m) == 0 {
			return nil
		}
		return labels.SelectorFromSet(m)
	}
	if c.InferencePool == "" {
		r.regular = sel(c.Selector)
	}
	r.prefill, r.decode = sel(c.PrefillSelector), sel(c.DecodeSelector)
	return r
}

// String shows the selectors for the log.
func (r *roles) String() string {
	var parts []string
	for _, s := range []struct {
		name string
		sel  labels.Selector
	}{{"regular", r.regular}, {"prefill", r.prefill}, {"decode", r.decode}} {
		if s.sel != nil {
			parts = append(parts, s.name+"{"+s.sel.String()+"}")
		}
	}
	return strings.Join(parts, " ")
}

// typeOf returns the worker type the pod's labels select, and false if none does.
func (r *roles) typeOf(l labels.Set) (worker.Type, bool) {
	switch {
	case r.prefill != nil && r.prefill.Matches(l):
		return worker.Prefill, true
	case r.decode != nil && r.decode.Matches(l):
		return worker.Decode, true
	case r.regular != nil && r.regular.Matches(l):
		return worker.Regular, true
	}
	return worker.Regular, false
}

// Routable reports whether the pod may take requests: Running, Ready, not being deleted, with an
// IP.
func Routable(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// targets returns the registrations the pod should have now: none unless it is selected and
// routable, else one per port.
func (d *Discovery) targets(p *corev1.Pod, r *roles) []Registration {
	typ, ok := r.typeOf(p.Labels)
	if !ok || !Routable(p) {
		return nil
	}
	ports := r.ports
	if len(ports) == 0 {
		port := r.port
		if r.portName != "" {
			if port = namedPort(p, r.portName); port == 0 {
				d.log.Warn("pod has no container port of the configured name; not a worker", "pod", p.Namespace+"/"+p.Name, "port_name", r.portName)
				return nil
			}
		}
		ports = []int{port}
	}
	base := Registration{Type: typ, Source: SourcePrefix + p.Namespace + "/" + p.Name}
	if d.cfg.ModelIDLabel != "" {
		base.ModelID = p.Labels[d.cfg.ModelIDLabel]
	}
	for k, v := range p.Annotations {
		name, ok := strings.CutPrefix(k, AnnotationPrefix)
		if !ok || name == "" {
			continue
		}
		if len(v) > maxAnnotationValue {
			d.log.Warn("ignoring an over-long annotation", "pod", p.Namespace+"/"+p.Name, "annotation", k, "bytes", len(v))
			continue
		}
		if name == "runtime" {
			base.Runtime = v
			continue
		}
		if base.Labels == nil {
			base.Labels = map[string]string{}
		}
		base.Labels[name] = v
	}
	if typ == worker.Prefill {
		if raw, ok := p.Annotations[d.cfg.BootstrapPortAnnotation]; ok {
			if bp, err := strconv.Atoi(strings.TrimSpace(raw)); err == nil && bp > 0 && bp <= 65535 {
				base.BootstrapPort = &bp
			} else {
				d.log.Warn("ignoring a bootstrap port that is not a port", "pod", p.Namespace+"/"+p.Name, "annotation", d.cfg.BootstrapPortAnnotation, "value", raw)
			}
		}
	}
	out := make([]Registration, 0, len(ports))
	for _, port := range ports {
		a := base
		a.URL = (&url.URL{Scheme: "http", Host: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))}).String()
		out = append(out, a)
	}
	return out
}

// namedPort returns the number of the pod's container port called name, or 0.
func namedPort(p *corev1.Pod, name string) int {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return int(cp.ContainerPort)
			}
		}
	}
	return 0
}

// slimPod turns a pod read by the dynamic client into a *corev1.Pod holding only what discovery
// reads, so that the informer's cache of a busy namespace stays small: names, labels,
// annotations, container ports, phase, IP and the Ready condition.
func slimPod(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // a tombstone on delete, or already slim
	}
	p := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		// A pod that does not read as one is no worker: keep its name only, so that a worker
		// it had is drained (an error here would stall the whole watch instead).
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(),
			UID: u.GetUID(), ResourceVersion: u.GetResourceVersion()}}, nil
	}
	slim := &corev1.Pod{}
	slim.Name, slim.Namespace, slim.UID, slim.ResourceVersion = p.Name, p.Namespace, p.UID, p.ResourceVersion
	slim.Labels, slim.Annotations, slim.DeletionTimestamp = p.Labels, p.Annotations, p.DeletionTimestamp
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			slim.Spec.Containers = append(slim.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	slim.Status.Phase, slim.Status.PodIP = p.Status.Phase, p.Status.PodIP
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			slim.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return slim, nil
}
