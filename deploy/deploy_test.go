package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// serviceMonitor is the part of the Prometheus Operator's monitoring.coreos.com/v1 ServiceMonitor
// that the manifests use; strict decoding fails on any field outside it, so a typo cannot hide.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// inferencePool is inference.networking.k8s.io/v1 InferencePool's spec as the example uses it.
type inferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Name string `json:"name"`
			Port struct {
				Number int32 `json:"number"`
			} `json:"port"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

// scaledObject is the part of KEDA's keda.sh/v1alpha1 ScaledObject that the autoscaling example
// uses, decoded strictly like the others.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount int32 `json:"minReplicaCount"`
		MaxReplicaCount int32 `json:"maxReplicaCount"`
		PollingInterval int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  int32 `json:"cooldownPeriod,omitempty"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig struct {
				Behavior autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced,omitempty"`
		Triggers []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// kinds maps apiVersion/kind to the Go type a manifest must decode into.
var kinds = map[string]func() any{
	"v1/ServiceAccount":                            func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                                 func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                    func() any { return &corev1.Secret{} },
	"v1/Service":                                   func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                           func() any { return &appsv1.Deployment{} },
	"rbac.authorization.k8s.io/v1/Role":            func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":     func() any { return &rbacv1.RoleBinding{} },
	"policy/v1/PodDisruptionBudget":                func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":       func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"monitoring.coreos.com/v1/ServiceMonitor":      func() any { return &serviceMonitor{} },
	"inference.networking.k8s.io/v1/InferencePool": func() any { return &inferencePool{} },
	"keda.sh/v1alpha1/ScaledObject":                func() any { return &scaledObject{} },
	"networking.k8s.io/v1/NetworkPolicy":           func() any { return &networkingv1.NetworkPolicy{} },
}

// object is one decoded manifest with where it came from.
type object struct {
	source string
	kind   string
	name   string
	obj    any
}

// decodeAll splits a multi-document YAML stream and decodes each document strictly: an unknown
// or duplicate field, a wrong type, or an unknown kind fails.
func decodeAll(t *testing.T, source string, data []byte) []object {
	t.Helper()
	var out []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s: no Go type for %s %s", source, tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %s: %v", source, tm.Kind, err)
		}
		name := ""
		if m, ok := obj.(metav1.Object); ok {
			name = m.GetName()
		}
		out = append(out, object{source: source, kind: tm.Kind, name: name, obj: obj})
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

func manifests(t *testing.T, dir string) []object {
	t.Helper()
	var out []object
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out = append(out, decodeAll(t, path, data)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStrictDecodingCatchesUnknownFields(t *testing.T) {
	bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n")
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(bad, &d); err == nil {
		t.Fatal("a misspelt field decoded without error")
	}
	var sm serviceMonitor
	if err := yaml.UnmarshalStrict([]byte("apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nspec:\n  endpoint: []\n"), &sm); err == nil {
		t.Fatal("a misspelt ServiceMonitor field decoded without error")
	}
}

func TestPlainManifests(t *testing.T) {
	objs := manifests(t, "kubernetes")
	checkGateway(t, objs, "kvgate")
	checkWorkers(t, objs, gatewayConfig(t, objs))
	for _, d := range find[*appsv1.Deployment](objs) {
		for _, c := range d.Spec.Template.Spec.Containers {
			if !pinned(c.Image) {
				t.Errorf("%s: image %q is not pinned to a release", d.Name, c.Image)
			}
		}
	}
	// The plain manifests deploy the release the chart does.
	chart, err := os.ReadFile("helm/kvgate/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %v", err)
	}
	for _, d := range find[*appsv1.Deployment](objs) {
		if img := d.Spec.Template.Spec.Containers[0].Image; d.Name == "kvgate" && img != "ghcr.io/kvgate/kvgate:"+meta.AppVersion {
			t.Errorf("gateway image %q, want the chart's appVersion %s", img, meta.AppVersion)
		}
	}
}

// pinned reports whether an image reference names a tag other than latest (or a digest).
func pinned(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	slash := strings.LastIndex(image, "/")
	_, tag, ok := strings.Cut(image[slash+1:], ":")
	return ok && tag != "" && tag != "latest"
}

// gatewayConfig returns the kvgate config file held by the manifests' ConfigMap.
func gatewayConfig(t *testing.T, objs []object) map[string]any {
	t.Helper()
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			var cfg map[string]any
			if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
				t.Fatalf("%s: config.yaml: %v", o.source, err)
			}
			return cfg
		}
	}
	t.Fatal("no ConfigMap")
	return nil
}

func find[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// checkGateway asserts what the issue asks of the gateway's Deployment and its companions.
func checkGateway(t *testing.T, objs []object, deployment string) {
	t.Helper()
	var gw *appsv1.Deployment
	for _, d := range find[*appsv1.Deployment](objs) {
		if d.Name == deployment {
			gw = d
		}
	}
	if gw == nil {
		t.Fatalf("no Deployment %q", deployment)
	}
	spec := gw.Spec.Template.Spec
	c := spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/liveness" {
		t.Error("liveness probe is not GET /liveness")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readiness" {
		t.Error("readiness probe is not GET /readiness")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Error("resources: want a CPU request and a memory limit")
	}
	grace := shutdownGrace(t, objs)
	preStop := time.Duration(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if tg := spec.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second <= grace+preStop {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than preStop %v + shutdown grace %v", tg, preStop, grace)
	}
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
		t.Error("the pod may run as root")
	}
	if gw.Spec.Strategy.RollingUpdate == nil || gw.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Error("a rolling update may take a replica down before its successor is ready")
	}
	var secretEnv []string
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secretEnv = append(secretEnv, e.Name)
		}
		if strings.Contains(e.Name, "KEY") && e.Value != "" {
			t.Errorf("env %s holds a key in clear", e.Name)
		}
	}
	sort.Strings(secretEnv)
	// The replica sync key comes from a Secret too where replica sync is on (the chart's default).
	if want := []string{"KVGATE_ADMIN_KEY", "KVGATE_API_KEYS"}; !slices.Equal(secretEnv, want) &&
		!slices.Equal(secretEnv, append(want, "KVGATE_REPLICA_SYNC_KEY")) {
		t.Errorf("keys from the Secret: got %v", secretEnv)
	}
	if !slices.Contains(c.Args, "--config") {
		t.Error("the gateway does not read its ConfigMap")
	}
	if img := c.Image; !pinned(img) {
		t.Errorf("gateway image %q: want a release tag, not latest", img)
	}
	sel := labels.SelectorFromSet(gw.Spec.Selector.MatchLabels)
	var clientSvcs []*corev1.Service
	for _, s := range find[*corev1.Service](objs) {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			clientSvcs = append(clientSvcs, s)
		}
	}
	if len(clientSvcs) != 1 || !sel.Matches(labels.Set(clientSvcs[0].Spec.Selector)) {
		t.Error("want one client Service selecting the gateway's pods")
	}
	if pdbs := find[*policyv1.PodDisruptionBudget](objs); len(pdbs) != 1 {
		t.Error("want one PodDisruptionBudget")
	}
	roles := find[*rbacv1.Role](objs)
	if len(roles) != 1 || len(find[*rbacv1.RoleBinding](objs)) != 1 || len(find[*corev1.ServiceAccount](objs)) != 1 {
		t.Fatal("want one ServiceAccount, Role and RoleBinding")
	}
	for _, r := range roles[0].Rules {
		if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) {
			t.Errorf("role grants %v: more than read access", r.Verbs)
		}
		for _, res := range r.Resources {
			if res != "pods" && res != "inferencepools" {
				t.Errorf("role reaches %q", res)
			}
		}
	}
}

// shutdownGrace reads shutdown-grace-period from the ConfigMap's config (default 30 s).
func shutdownGrace(t *testing.T, objs []object) time.Duration {
	t.Helper()
	v, ok := gatewayConfig(t, objs)["shutdown-grace-period"]
	if !ok {
		return 30 * time.Second
	}
	d, err := time.ParseDuration(v.(string))
	if err != nil {
		t.Fatalf("shutdown-grace-period: %v", err)
	}
	return d
}

// checkWorkers asserts that the example worker Deployments carry what discovery reads.
func checkWorkers(t *testing.T, objs []object, cfg map[string]any) {
	t.Helper()
	regular := selector(t, cfg["selector"])
	prefill := labels.SelectorFromSet(map[string]string{"app.kubernetes.io/component": "llm-prefill"})
	decode := labels.SelectorFromSet(map[string]string{"app.kubernetes.io/component": "llm-decode"})
	found := map[string]int{}
	for _, d := range find[*appsv1.Deployment](objs) {
		tpl := d.Spec.Template
		l := labels.Set(tpl.Labels)
		role := ""
		switch {
		case regular.Matches(l):
			role = "regular"
		case prefill.Matches(l):
			role = "prefill"
			if tpl.Annotations["sglang.ai/bootstrap-port"] == "" {
				t.Errorf("%s: prefill pods without the sglang.ai/bootstrap-port annotation", d.Name)
			}
		case decode.Matches(l):
			role = "decode"
		default:
			continue
		}
		found[role]++
		if role == "regular" {
			found["regular "+tpl.Annotations["kvgate.io/runtime"]]++
		}
		if !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(l) {
			t.Errorf("%s: the Deployment's selector does not match its pods", d.Name)
		}
		port := ""
		for _, p := range tpl.Spec.Containers[0].Ports {
			if p.Name == cfg["service-discovery-port"] {
				port = p.Name
			}
		}
		if port == "" {
			t.Errorf("%s: no container port named %v", d.Name, cfg["service-discovery-port"])
		}
		if tpl.Spec.Containers[0].ReadinessProbe == nil {
			t.Errorf("%s: no readiness probe: the pod would be routed to before its model loads", d.Name)
		}
	}
	if found["regular vllm"] == 0 || found["regular sglang"] == 0 || found["prefill"] == 0 || found["decode"] == 0 {
		t.Errorf("example workers by role: %v; want regular vLLM and SGLang workers, and SGLang prefill/decode", found)
	}
}

func selector(t *testing.T, v any) labels.Selector {
	t.Helper()
	list, _ := v.([]any)
	set := labels.Set{}
	for _, e := range list {
		k, val, ok := strings.Cut(e.(string), "=")
		if !ok {
			t.Fatalf("selector entry %q", e)
		}
		set[k] = val
	}
	if len(set) == 0 {
		t.Fatal("the config selects no workers")
	}
	return labels.SelectorFromSet(set)
}
