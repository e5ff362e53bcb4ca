package deploy

import (
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// renderFiles renders the chart as `helm template` would, with overrides over values.yaml, and
// returns every rendered file by name (NOTES.txt included), or the error helm would print:
// values.schema.json is checked here, as helm install and helm template check it.
func renderFiles(t *testing.T, overrides map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load("helm/kvgate")
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Validate(); err != nil {
		t.Fatal(err)
	}
	if ch.Schema == nil {
		t.Fatal("the chart has no values.schema.json")
	}
	vals, err := chartutil.ToRenderValues(ch, overrides,
		chartutil.ReleaseOptions{Name: "kvgate", Namespace: "llm", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return new(engine.Engine).Render(ch, vals)
}

// render renders the chart and decodes every manifest strictly.
func render(t *testing.T, overrides map[string]any) []object {
	t.Helper()
	files, err := renderFiles(t, overrides)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []object
	for _, n := range names {
		if strings.HasSuffix(n, ".tpl") || strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		out = append(out, decodeAll(t, n, []byte(files[n]))...)
	}
	return out
}

func TestChartDefaults(t *testing.T) {
	objs := render(t, nil)
	checkGateway(t, objs, "kvgate")
	if n := len(find[*corev1.Secret](objs)); n != 2 {
		t.Errorf("want the chart to create the keys Secret and the replica sync key's, got %d", n)
	}
	if n := len(find[*serviceMonitor](objs)) + len(find[*autoscalingv2.HorizontalPodAutoscaler](objs)); n != 0 {
		t.Errorf("ServiceMonitor and HPA are opt-in, got %d", n)
	}
	d := find[*appsv1.Deployment](objs)[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas: got %v, want 2", d.Spec.Replicas)
	}
	ch, err := loader.Load("helm/kvgate")
	if err != nil {
		t.Fatal(err)
	}
	if want := "ghcr.io/kvgate/kvgate:" + ch.Metadata.AppVersion; d.Spec.Template.Spec.Containers[0].Image != want {
		t.Errorf("image %q, want %q: the chart deploys its appVersion", d.Spec.Template.Spec.Containers[0].Image, want)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if slices.Contains(c.Args, "--admin-host") || slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" }) {
		t.Errorf("by default the admin plane stays on loopback: args %v, ports %v", c.Args, c.Ports)
	}
	// Two replicas by default, so they share their decisions by default (replica sync, embedded).
	if i := slices.Index(c.Args, "--replica-sync"); i < 0 || c.Args[i+1] != "embedded" {
		t.Errorf("args %v: want --replica-sync embedded by default", c.Args)
	}
}

// values.schema.json turns a mistyped or out-of-range value into an install error instead of a
// silently different deployment.
func TestChartSchemaRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"antiAffinity", map[string]any{"antiAffinity": "bogus"}, "antiAffinity"},
		{"unknown top-level key", map[string]any{"replicaCont": 3}, "replicaCont"},
		{"misspelt nested key", map[string]any{"autoscaling": map[string]any{"enable": true}}, "enable"},
		{"port out of range", map[string]any{"metricsPort": 70000}, "metricsPort"},
		{"replicas a string", map[string]any{"replicaCount": "two"}, "replicaCount"},
		{"pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderFiles(t, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a schema error naming %s", err, tc.want)
			}
		})
	}
	for _, ok := range []string{"soft", "hard", "none"} {
		if _, err := renderFiles(t, map[string]any{"antiAffinity": ok}); err != nil {
			t.Errorf("antiAffinity %s: %v", ok, err)
		}
	}
}

// NOTES.txt tells the installer how to reach the API and the admin plane of this release.
func TestChartNotes(t *testing.T) {
	files, err := renderFiles(t, map[string]any{"keys": map[string]any{"adminKey": "k"}})
	if err != nil {
		t.Fatal(err)
	}
	notes := files["kvgate/templates/NOTES.txt"]
	for _, want := range []string{
		"http://kvgate.llm.svc/v1",
		"kubectl -n llm port-forward svc/kvgate 8080:80",
		"kubectl -n llm port-forward deploy/kvgate 30001:30001",
		"app.kubernetes.io/component=llm-worker",
		"Authorization: Bearer $ADMIN_KEY",
		"/readiness/workers",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "<no value>") || strings.Contains(notes, "%!") {
		t.Errorf("NOTES.txt renders a missing value:\n%s", notes)
	}
}

// admin.service exposes each replica's admin plane through a headless Service, and only with a
// key: the gateway would refuse to start otherwise, so the chart refuses first.
func TestChartAdminService(t *testing.T) {
	if _, err := renderFiles(t, map[string]any{"admin": map[string]any{"service": map[string]any{"enabled": true}}}); err == nil ||
		!strings.Contains(err.Error(), "admin key") {
		t.Fatalf("admin service without a key: got %v, want a refusal", err)
	}
	objs := render(t, map[string]any{"admin": map[string]any{"service": map[string]any{"enabled": true}},
		"keys": map[string]any{"existingSecret": "my-keys"}})
	var admin *corev1.Service
	for _, s := range find[*corev1.Service](objs) {
		if s.Name == "kvgate-admin" {
			admin = s
		}
	}
	if admin == nil || admin.Spec.ClusterIP != corev1.ClusterIPNone || len(admin.Spec.Ports) != 1 ||
		admin.Spec.Ports[0].Port != 30001 || admin.Spec.Ports[0].TargetPort.StrVal != "admin" {
		t.Fatalf("want a headless admin Service on port 30001, got %+v", admin)
	}
	c := find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]
	if i := slices.Index(c.Args, "--admin-host"); i < 0 || c.Args[i+1] != "0.0.0.0" {
		t.Errorf("args %v: want --admin-host 0.0.0.0", c.Args)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" && p.ContainerPort == 30001 }) {
		t.Errorf("ports %v: want admin 30001", c.Ports)
	}
}

func TestChartOptions(t *testing.T) {
	objs := render(t, map[string]any{
		"keys":           map[string]any{"existingSecret": "my-keys"},
		"replicaSync":    map[string]any{"keySecret": "my-keys"},
		"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
		"autoscaling":    map[string]any{"enabled": true},
		"rbac":           map[string]any{"inferencePool": true},
		"antiAffinity":   "hard",
		"config":         map[string]any{"service-discovery": true, "inference-pool": "llama"},
	})
	checkGateway(t, objs, "kvgate")
	if n := len(find[*corev1.Secret](objs)); n != 0 {
		t.Errorf("with an existing Secret the chart must not create one, got %d", n)
	}
	sms := find[*serviceMonitor](objs)
	if len(sms) != 1 || sms[0].Labels["release"] != "prom" || sms[0].Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor: %+v", sms)
	}
	if len(find[*autoscalingv2.HorizontalPodAutoscaler](objs)) != 1 {
		t.Error("want an HPA")
	}
	d := find[*appsv1.Deployment](objs)[0]
	if d.Spec.Replicas != nil {
		t.Error("with autoscaling on, the Deployment must leave replicas to the HPA")
	}
	if d.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Error("antiAffinity hard: want a required term")
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Name != "my-keys" {
			t.Errorf("%s from Secret %q, want my-keys", e.Name, ref.SecretKeyRef.Name)
		}
	}
}

// TestChartReplicaSync: embedded replica sync needs its key Secret, and brings the flags, the
// cluster port, a headless Service that lists not-ready pods and a NetworkPolicy admitting the
// cluster port from the gateway's pods only; url mode passes the URL and opens nothing.
func TestChartReplicaSync(t *testing.T) {
	// Embedded without a key Secret named: the chart makes one, with a random key of 48
	// characters, and the replicas read it.
	objs := render(t, map[string]any{"replicaSync": map[string]any{"mode": "embedded"}})
	var key *corev1.Secret
	for _, s := range find[*corev1.Secret](objs) {
		if s.Name == "kvgate-sync-key" {
			key = s
		}
	}
	if key == nil || len(key.Data["KVGATE_REPLICA_SYNC_KEY"]) != 48 {
		t.Fatalf("want a Secret kvgate-sync-key holding a 48-byte KVGATE_REPLICA_SYNC_KEY, got %+v", key)
	}
	again := render(t, map[string]any{"replicaSync": map[string]any{"mode": "embedded"}})
	for _, s := range find[*corev1.Secret](again) {
		if s.Name == "kvgate-sync-key" && string(s.Data["KVGATE_REPLICA_SYNC_KEY"]) == string(key.Data["KVGATE_REPLICA_SYNC_KEY"]) {
			t.Error("two installs rendered the same sync key")
		}
	}
	if c := find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]; !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "KVGATE_REPLICA_SYNC_KEY" && e.ValueFrom.SecretKeyRef.Name == "kvgate-sync-key"
	}) {
		t.Errorf("env %v: want KVGATE_REPLICA_SYNC_KEY from kvgate-sync-key", c.Env)
	}
	// Off: no flag, no key, no cluster port, no sync Service or NetworkPolicy.
	objs = render(t, map[string]any{"replicaSync": map[string]any{"mode": "off"}})
	if c := find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]; slices.Contains(c.Args, "--replica-sync") ||
		len(c.Ports) != 2 || slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KVGATE_REPLICA_SYNC_KEY" }) {
		t.Errorf("replica sync off: args %v, ports %v, env %v", c.Args, c.Ports, c.Env)
	}
	if n, m := len(find[*corev1.Secret](objs)), len(find[*networkingv1.NetworkPolicy](objs)); n != 1 || m != 0 {
		t.Errorf("replica sync off: %d Secrets (want the keys' alone), %d NetworkPolicies", n, m)
	}
	if _, err := renderFiles(t, map[string]any{"replicaSync": map[string]any{"mode": "url", "url": "nats://u:p@nats:4222"}}); err == nil {
		t.Error("credentials in the URL were accepted")
	}
	objs = render(t, map[string]any{"replicaSync": map[string]any{"mode": "embedded", "keySecret": "sync-key"}})
	c := find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]
	for flag, want := range map[string]string{"--replica-sync": "embedded", "--replica-sync-listen": "0.0.0.0:6222",
		"--replica-sync-peers": "kvgate-sync.llm.svc:6222"} {
		if i := slices.Index(c.Args, flag); i < 0 || c.Args[i+1] != want {
			t.Errorf("args %v: want %s %s", c.Args, flag, want)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "KVGATE_REPLICA_SYNC_KEY" && e.ValueFrom.SecretKeyRef.Name == "sync-key"
	}) {
		t.Errorf("env %v: want KVGATE_REPLICA_SYNC_KEY from sync-key", c.Env)
	}
	var svc *corev1.Service
	for _, s := range find[*corev1.Service](objs) {
		if s.Name == "kvgate-sync" {
			svc = s
		}
	}
	if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || svc.Spec.Ports[0].Port != 6222 {
		t.Fatalf("want a headless sync Service on 6222 listing not-ready pods, got %+v", svc)
	}
	nps := find[*networkingv1.NetworkPolicy](objs)
	if len(nps) != 1 || len(nps[0].Spec.Ingress[0].From) != 1 || nps[0].Spec.Ingress[0].Ports[0].Port.StrVal != "sync" {
		t.Fatalf("want a NetworkPolicy admitting the sync port from the gateway pods, got %+v", nps)
	}
	objs = render(t, map[string]any{"replicaSync": map[string]any{"mode": "url", "url": "tls://nats.messaging:4222"}})
	c = find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]
	if i := slices.Index(c.Args, "--replica-sync"); i < 0 || c.Args[i+1] != "tls://nats.messaging:4222" {
		t.Errorf("args %v: want --replica-sync tls://nats.messaging:4222", c.Args)
	}
	if n := len(find[*networkingv1.NetworkPolicy](objs)); n != 0 {
		t.Errorf("url mode rendered %d NetworkPolicies", n)
	}
}
