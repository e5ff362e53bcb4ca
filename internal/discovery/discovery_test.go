package discovery

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/policy"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/worker"
)

const ns = "inference"

// engine is a loopback worker: /v1/models names model; POST streams two SSE chunks, the second
// only once hold (when set) is closed.
type engine struct {
	*httptest.Server
	port    int
	started chan struct{}
	hold    chan struct{}
}

func newEngine(t *testing.T, model string) *engine {
	t.Helper()
	e := &engine{started: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"vllm"}]}`, model)
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		e.started <- struct{}{}
		if e.hold != nil {
			<-e.hold
		}
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n")
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	e.port = e.Listener.Addr().(*net.TCPAddr).Port
	return e
}

// newClient returns a fake API server holding objs, serving pods and InferencePools.
func newClient(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{PodsGVR: "PodList", InferencePoolGVR: "InferencePoolList"}, objs...)
}

// registrar registers through the gateway's admin path, as the command wires it.
type registrar struct{ gw *gateway.Server }

func (r registrar) Register(ctx context.Context, a Registration) (*worker.Worker, error) {
	w, err := r.gw.Register(ctx, gateway.AddWorkerRequest{URL: a.URL, ModelID: a.ModelID, WorkerType: a.Type.String(),
		BootstrapPort: a.BootstrapPort, Labels: a.Labels, Runtime: a.Runtime, Source: a.Source})
	if re := (*gateway.RegisterError)(nil); errors.As(err, &re) && re.Status == http.StatusBadRequest {
		return nil, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	return w, err
}

func (r registrar) Remove(id string) (*worker.Worker, error) { return r.gw.Registry().Remove(id) }

// harness is a gateway fed by discovery over a fake API server, with the registry's events on
// a channel.
type harness struct {
	t      *testing.T
	cs     *dynamicfake.FakeDynamicClient
	gw     *gateway.Server
	d      *Discovery
	events chan worker.Event
}

func newHarness(t *testing.T, cfg Config, cs *dynamicfake.FakeDynamicClient) *harness {
	t.Helper()
	reg := worker.NewRegistry()
	router, err := policy.NewRouter("round_robin", policy.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	gcfg := gateway.DefaultConfig()
	gcfg.Health.Disabled = true
	gcfg.ProbeTimeout = time.Second
	gcfg.Logger = slog.New(slog.DiscardHandler)
	h := &harness{t: t, cs: cs, gw: gateway.New(gcfg, reg, router, nil), events: make(chan worker.Event, 64)}
	reg.Subscribe(func(e worker.Event) { h.events <- e })
	cfg.Namespace = ns
	cfg.Logger = slog.New(slog.DiscardHandler)
	d, err := New(cfg, cs, registrar{h.gw})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	h.d = d
	return h
}

// next returns the registry's next event, failing after a bound.
func (h *harness) next() worker.Event {
	h.t.Helper()
	select {
	case e := <-h.events:
		return e
	case <-time.After(10 * time.Second):
		h.t.Fatal("no registry event within 10s")
		return worker.Event{}
	}
}

// quiet asserts that no registry event comes for a short while.
func (h *harness) quiet() {
	h.t.Helper()
	select {
	case e := <-h.events:
		h.t.Fatalf("unexpected registry event: removed=%v url=%s", e.Removed, e.Worker.Spec.URL)
	case <-time.After(200 * time.Millisecond):
	}
}

func (h *harness) apply(p *corev1.Pod) {
	h.t.Helper()
	ctx := context.Background()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		h.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion("v1")
	u.SetKind("Pod")
	pods := h.cs.Resource(PodsGVR).Namespace(ns)
	if _, err := pods.Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
		if _, err := pods.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		return
	}
	if _, err := pods.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) delete(name string) {
	h.t.Helper()
	if err := h.cs.Resource(PodsGVR).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// pod builds a pod serving on port at ip; ready sets its Ready condition.
func pod(name, ip string, port int, ready bool, lbls map[string]string) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: int32(port)}, {Name: "metrics", ContainerPort: 9999}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func addr(ip string, port int) string { return "http://" + net.JoinHostPort(ip, strconv.Itoa(port)) }

func TestPodLifecycle(t *testing.T) {
	e := newEngine(t, "served-model")
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, PortName: "http", ModelIDLabel: "model"}, newClient())
	sel := map[string]string{"app": "engine", "model": "llama"}

	p := pod("a", "127.0.0.1", e.port, false, sel)
	h.apply(p)
	h.quiet() // not ready: not a worker

	p.Status.Conditions[0].Status = corev1.ConditionTrue
	p.Annotations["kvgate.io/policy"] = "least_load"
	p.Annotations["kvgate.io/cb_failure_threshold"] = "3"
	p.Annotations["other.io/ignored"] = "x"
	h.apply(p)
	ev := h.next()
	w := ev.Worker
	if ev.Removed || w.Spec.URL != addr("127.0.0.1", e.port) || w.Spec.Type != worker.Regular {
		t.Fatalf("ready pod: got removed=%v url=%s type=%v", ev.Removed, w.Spec.URL, w.Spec.Type)
	}
	if got := w.Spec.Models; len(got) != 1 || got[0] != "llama" {
		t.Errorf("model from the label: got %v, want [llama]", got)
	}
	if w.Label("policy") != "least_load" || w.Label("cb_failure_threshold") != "3" || len(w.Spec.Labels) != 2 {
		t.Errorf("labels from kvgate.io/ annotations: got %v", w.Spec.Labels)
	}
	if w.Spec.Source != "kubernetes:inference/a" || !w.Available() {
		t.Errorf("source %q available %v", w.Spec.Source, w.Available())
	}

	// A status update that changes nothing discovery reads leaves the worker alone.
	p.Status.Conditions[0].LastProbeTime = metav1.Now()
	h.apply(p)
	h.quiet()

	// Not ready: drained and removed.
	p.Status.Conditions[0].Status = corev1.ConditionFalse
	h.apply(p)
	if ev := h.next(); !ev.Removed || ev.Worker != w || !w.Draining() {
		t.Fatalf("unready pod: want its worker drained and removed, got removed=%v", ev.Removed)
	}

	// Ready again, then a new IP: the old address is drained and the new one registered.
	p.Status.Conditions[0].Status = corev1.ConditionTrue
	h.apply(p)
	w = h.next().Worker
	p.Status.PodIP = "127.0.0.2"
	h.apply(p)
	if ev := h.next(); !ev.Removed || ev.Worker != w {
		t.Fatal("IP change: want the old worker removed first")
	}
	if ev := h.next(); ev.Removed || ev.Worker.Spec.URL != addr("127.0.0.2", e.port) {
		t.Fatalf("IP change: want the new address registered, got %s", ev.Worker.Spec.URL)
	}

	// Relabelled out of the selector: removed.
	p.Labels = map[string]string{"app": "other", "model": "llama"}
	h.apply(p)
	if ev := h.next(); !ev.Removed {
		t.Fatal("relabelled pod: want its worker removed")
	}

	// Relabelled back, then terminating: drained at once, before the pod is gone.
	p.Labels = sel
	p.Status.PodIP = "127.0.0.1"
	h.apply(p)
	h.next()
	now := metav1.Now()
	p.DeletionTimestamp = &now
	h.apply(p)
	if ev := h.next(); !ev.Removed {
		t.Fatal("terminating pod: want its worker removed")
	}
	p.DeletionTimestamp = nil
	h.apply(p)
	h.next()
	h.delete("a")
	if ev := h.next(); !ev.Removed {
		t.Fatal("deleted pod: want its worker removed")
	}
	if n := len(h.gw.Registry().View().All); n != 0 || h.d.Owned() != 0 {
		t.Fatalf("after delete: %d workers, %d owned", n, h.d.Owned())
	}
}

func TestModelLearnedFromWorker(t *testing.T) {
	e := newEngine(t, "learned-model")
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, Port: e.port}, newClient())
	h.apply(pod("a", "127.0.0.1", 1, true, map[string]string{"app": "engine"}))
	w := h.next().Worker
	if got := w.Spec.Models; len(got) != 1 || got[0] != "learned-model" || w.Runtime() != "vllm" {
		t.Fatalf("got models %v runtime %q, want [learned-model] from /v1/models", got, w.Runtime())
	}
}

func TestPrefillDecodeSelection(t *testing.T) {
	pe, de := newEngine(t, "m"), newEngine(t, "m")
	h := newHarness(t, Config{
		PrefillSelector: map[string]string{"role": "prefill"},
		DecodeSelector:  map[string]string{"role": "decode"},
		PortName:        "http", ModelIDLabel: "model",
	}, newClient())
	pp := pod("p", "127.0.0.1", pe.port, true, map[string]string{"role": "prefill", "model": "m"})
	pp.Annotations[DefaultBootstrapPortAnnotation] = "8998"
	h.apply(pp)
	h.apply(pod("d", "127.0.0.1", de.port, true, map[string]string{"role": "decode", "model": "m"}))
	h.apply(pod("x", "127.0.0.1", de.port+1, true, map[string]string{"role": "other", "model": "m"}))
	got := map[string]*worker.Worker{}
	for range 2 {
		w := h.next().Worker
		got[w.Spec.Type.String()] = w
	}
	h.quiet()
	p, d := got["prefill"], got["decode"]
	if p == nil || d == nil {
		t.Fatalf("want one prefill and one decode worker, got %v", got)
	}
	if p.Spec.BootstrapPort == nil || *p.Spec.BootstrapPort != 8998 || d.Spec.BootstrapPort != nil {
		t.Errorf("bootstrap ports: prefill %v decode %v, want 8998 and none", p.Spec.BootstrapPort, d.Spec.BootstrapPort)
	}
	if pool := h.gw.Registry().View().Pool("m"); pool == nil || !pool.Disaggregated() {
		t.Error("want model m served disaggregated")
	}
}

func TestBadAnnotationWaitsForAFix(t *testing.T) {
	e := newEngine(t, "m")
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, PortName: "http"}, newClient())
	p := pod("a", "127.0.0.1", e.port, true, map[string]string{"app": "engine"})
	p.Annotations["kvgate.io/cb_failure_threshold"] = "many"
	h.apply(p)
	h.quiet()
	p.Annotations["kvgate.io/cb_failure_threshold"] = "4"
	h.apply(p)
	if w := h.next().Worker; w.Label("cb_failure_threshold") != "4" {
		t.Fatalf("fixed annotation: got labels %v", w.Spec.Labels)
	}
}

// Workers from flags and the admin API stay when discovered pods come and go, and discovery
// never removes a worker it did not register, even at the same address.
func TestCoexistsWithAdminWorkers(t *testing.T) {
	e1, e2 := newEngine(t, "m"), newEngine(t, "m")
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, PortName: "http"}, newClient())
	admin, err := h.gw.Register(context.Background(), gateway.AddWorkerRequest{URL: e1.URL})
	if err != nil {
		t.Fatal(err)
	}
	h.next()
	h.apply(pod("same", "127.0.0.1", e1.port, true, map[string]string{"app": "engine"}))
	h.apply(pod("other", "127.0.0.1", e2.port, true, map[string]string{"app": "engine"}))
	w := h.next().Worker
	if w.Spec.URL != e2.URL {
		t.Fatalf("want the other pod registered, got %s", w.Spec.URL)
	}

	// The admin API may not delete a discovered worker while its pod exists.
	srv := httptest.NewServer(h.gw.AdminHandler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/workers/"+w.ID, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "worker_managed") {
		t.Fatalf("DELETE of a discovered worker: got %d %s, want 409 worker_managed", resp.StatusCode, body)
	}

	h.delete("same")
	h.delete("other")
	if ev := h.next(); !ev.Removed || ev.Worker != w {
		t.Fatal("want only the discovered worker removed")
	}
	h.quiet()
	if h.gw.Registry().View().Get(admin.ID) == nil {
		t.Fatal("the admin worker at the same address as a deleted pod was removed")
	}
}

func inferencePool(name string, match map[string]any, ports ...int64) *unstructured.Unstructured {
	tps := make([]any, 0, len(ports))
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": p})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": match}, "targetPorts": tps,
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}}},
	}}
	return u
}

func TestInferencePoolChanges(t *testing.T) {
	e1, e2, e3 := newEngine(t, "m"), newEngine(t, "m"), newEngine(t, "m")
	dyn := newClient(
		inferencePool("pool", map[string]any{"app": "vllm"}, int64(e1.port), int64(e2.port)),
		inferencePool("unrelated", map[string]any{"app": "other"}, int64(e3.port)))
	h := newHarness(t, Config{InferencePool: "pool", ModelIDLabel: "model"}, dyn)
	h.apply(pod("a", "127.0.0.1", 1, true, map[string]string{"app": "vllm", "model": "m"}))
	h.apply(pod("b", "127.0.0.1", 1, true, map[string]string{"app": "other", "model": "m"}))
	urls := map[string]bool{}
	for range 2 {
		urls[h.next().Worker.Spec.URL] = true
	}
	h.quiet()
	if !urls[e1.URL] || !urls[e2.URL] {
		t.Fatalf("want one worker per target port of pod a, got %v", urls)
	}

	// The pool's selector and port change: pod a's workers drain, pod b's join.
	pools := dyn.Resource(InferencePoolGVR).Namespace(ns)
	if _, err := pools.Update(context.Background(), inferencePool("pool", map[string]any{"app": "other"}, int64(e3.port)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	removed, added := 0, ""
	for range 3 {
		if ev := h.next(); ev.Removed {
			removed++
		} else {
			added = ev.Worker.Spec.URL
		}
	}
	if removed != 2 || added != e3.URL {
		t.Fatalf("after the pool changed: %d removed, %q added; want 2 and %s", removed, added, e3.URL)
	}

	// A bad edit is ignored; deleting the pool drains its workers.
	bad := inferencePool("pool", map[string]any{"app": "other"})
	if _, err := pools.Update(context.Background(), bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.quiet()
	if err := pools.Delete(context.Background(), "pool", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := h.next(); !ev.Removed {
		t.Fatal("deleted pool: want its worker removed")
	}
}

func TestParsePool(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *unstructured.Unstructured
		ok   bool
	}{
		{"good", inferencePool("p", map[string]any{"a": "b"}, 8000, 8001), true},
		{"no ports", inferencePool("p", map[string]any{"a": "b"}), false},
		{"no selector", inferencePool("p", map[string]any{}, 8000), false},
		{"port out of range", inferencePool("p", map[string]any{"a": "b"}, 70000), false},
		{"selector not strings", inferencePool("p", map[string]any{"a": int64(1)}, 8000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePool(tc.u)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && (len(p.ports) != 2 || p.matchLabels["a"] != "b") {
				t.Fatalf("got %+v", p)
			}
		})
	}
}

// A watch that fails is resumed: the reflector lists again and a pod created meanwhile joins.
func TestWatchErrorResumes(t *testing.T) {
	e := newEngine(t, "m")
	cs := newClient()
	first := watch.NewRaceFreeFake()
	var watches atomic.Int32
	rewatched := make(chan struct{})
	cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		switch watches.Add(1) {
		case 1:
			return true, first, nil
		case 2:
			// The tracker's own watch from here on, open before the test is told.
			w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
			close(rewatched)
			return true, w, err
		}
		return false, nil, nil
	})
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, PortName: "http"}, cs)
	// Created while the watch is the broken one: only a fresh list can see it.
	h.apply(pod("a", "127.0.0.1", e.port, true, map[string]string{"app": "engine"}))
	h.quiet()
	first.Error(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	if w := h.next().Worker; w.Spec.URL != e.URL {
		t.Fatalf("after the watch resumed: got %s", w.Spec.URL)
	}
	// The resumed watch delivers events again.
	select {
	case <-rewatched:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch was not re-opened")
	}
	h.delete("a")
	if ev := h.next(); !ev.Removed {
		t.Fatal("want the deleted pod's worker removed through the resumed watch")
	}
}

// A request in flight on a pod that goes unready finishes whole; new requests no longer go there.
func TestInFlightRequestFinishesWhenPodGoesUnready(t *testing.T) {
	e := newEngine(t, "m")
	e.hold = make(chan struct{})
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, PortName: "http"}, newClient())
	p := pod("a", "127.0.0.1", e.port, true, map[string]string{"app": "engine"})
	h.apply(p)
	w := h.next().Worker
	srv := httptest.NewServer(h.gw.Handler())
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	testutil.Recv(t, e.started, "the stream at the engine")
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, `"a"`) {
		t.Fatalf("first chunk: %q", line)
	}

	p.Status.Conditions[0].Status = corev1.ConditionFalse
	h.apply(p)
	if ev := h.next(); !ev.Removed || ev.Worker != w {
		t.Fatal("want the unready pod's worker removed")
	}
	if w.Inflight() != 1 {
		t.Fatalf("in flight on the drained worker: %d, want 1", w.Inflight())
	}
	r2, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("new request after the drain: got %d, want 503", r2.StatusCode)
	}

	close(e.hold)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(rest), `"b"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the in-flight stream did not finish whole: status %d, rest %q", resp.StatusCode, rest)
	}
	if w.Inflight() != 0 {
		t.Fatalf("in flight after the stream ended: %d", w.Inflight())
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		ok   bool
	}{
		{"selector", Config{Namespace: "n", Selector: map[string]string{"a": "b"}}, true},
		{"pool", Config{Namespace: "n", InferencePool: "p"}, true},
		{"no namespace", Config{Selector: map[string]string{"a": "b"}}, false},
		{"nothing selected", Config{Namespace: "n"}, false},
		{"bad label value", Config{Namespace: "n", Selector: map[string]string{"a": "b c"}}, false},
		{"bad port", Config{Namespace: "n", Selector: map[string]string{"a": "b"}, Port: 70000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// A pod whose address leads back to the gateway itself (its own listener: a pod of the gateway's
// Deployment matched by a careless selector) is never registered: the probe comes back with the
// gateway's own hop id.
func TestPodThatIsTheGatewayIsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	h := newHarness(t, Config{Selector: map[string]string{"app": "engine"}, Port: port}, newClient())
	self := httptest.NewUnstartedServer(h.gw.Handler())
	self.Listener.Close()
	self.Listener = ln
	self.Start()
	t.Cleanup(self.Close)
	// With a worker of its own, the gateway's /v1/models lists a model, as an engine's would.
	if _, err := h.gw.Register(context.Background(), gateway.AddWorkerRequest{URL: newEngine(t, "m").URL}); err != nil {
		t.Fatal(err)
	}
	h.next()
	h.apply(pod("gw", "127.0.0.1", port, true, map[string]string{"app": "engine"}))
	h.quiet()
	if n := len(h.gw.Registry().View().All); n != 1 {
		t.Fatalf("%d workers registered, want only the engine", n)
	}
}
