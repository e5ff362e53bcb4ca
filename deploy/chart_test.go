package deploy

import (
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// render renders the chart as `helm template` would, with overrides over values.yaml.
func render(t *testing.T, overrides map[string]any) []object {
	t.Helper()
	ch, err := loader.Load("helm/kvgate")
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Validate(); err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(ch, overrides,
		chartutil.ReleaseOptions{Name: "kvgate", Namespace: "llm", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := new(engine.Engine).Render(ch, vals)
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
	if n := len(find[*corev1.Secret](objs)); n != 1 {
		t.Errorf("want the chart to create the keys Secret, got %d", n)
	}
	if n := len(find[*serviceMonitor](objs)) + len(find[*autoscalingv2.HorizontalPodAutoscaler](objs)); n != 0 {
		t.Errorf("ServiceMonitor and HPA are opt-in, got %d", n)
	}
	d := find[*appsv1.Deployment](objs)[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas: got %v, want 2", d.Spec.Replicas)
	}
}

func TestChartOptions(t *testing.T) {
	objs := render(t, map[string]any{
		"keys":           map[string]any{"existingSecret": "my-keys"},
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
