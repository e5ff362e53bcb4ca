// Package discovery finds workers in Kubernetes: it watches the pods of one namespace with
// client-go informers and keeps a worker registry in step with them, through the Registrar
// interface (the gateway's registration path implements it).
//
// A pod matched by a selector becomes a worker while it is Running, Ready, not terminating and
// has an IP; it is drained (its in-flight requests finish, no new ones reach it) as soon as one
// of those stops holding, when it is deleted, or when its address changes. The selector and
// port come from flags, or from a Gateway API Inference Extension InferencePool that is followed
// as it changes. Workers from flags and the admin API live beside the discovered ones; discovery
// only ever removes the workers it registered itself.
//
// Informer callbacks only queue pod keys; a few reconcile goroutines turn each key into
// registrations, so that a slow registration probe never stalls the watch.
//
// Pods and InferencePools are both read with client-go's dynamic client and a plain shared
// informer, not the typed clientset and its informer factory: those two packages alone pull in
// every Kubernetes API group's client, lister and informer, which more than quadrupled the
// binary's Kubernetes code for the one resource discovery reads.
package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kvgate/kvgate/internal/worker"
)

// PodsGVR names the core v1 pods resource, which discovery watches.
var PodsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Defaults of service discovery.
const (
	// DefaultPort is the worker port when neither a named port nor an InferencePool gives one.
	DefaultPort = 8000
	// DefaultBootstrapPortAnnotation carries a prefill pod's KV bootstrap port (SGLang's name).
	DefaultBootstrapPortAnnotation = "sglang.ai/bootstrap-port"
	// AnnotationPrefix marks the pod annotations that become worker labels: kvgate.io/policy,
	// kvgate.io/cb_failure_threshold, kvgate.io/health_check_path, ... (kvgate.io/runtime sets the
	// runtime instead).
	AnnotationPrefix = "kvgate.io/"
	// SourcePrefix starts the worker.Spec.Source of every discovered worker.
	SourcePrefix = "kubernetes:"
)

// maxAnnotationValue bounds one kvgate.io/ annotation value; a longer one is ignored.
const maxAnnotationValue = 1024

// Config says which pods become workers. The zero value watches nothing; see Validate.
type Config struct {
	// Namespace is the namespace watched. Required (the command line defaults it to the
	// gateway pod's own).
	Namespace string
	// Selector picks regular workers by label (all of its pairs must match). Ignored when
	// InferencePool is set.
	Selector map[string]string
	// PrefillSelector and DecodeSelector pick the two halves of a disaggregated pool. A pod
	// matched by several selectors takes the first of prefill, decode, regular.
	PrefillSelector, DecodeSelector map[string]string
	// Port is the worker's port number. 0 means DefaultPort.
	Port int
	// PortName, when set, takes the port from the container port of that name instead; a pod
	// without it is not a worker.
	PortName string
	// BootstrapPortAnnotation names the prefill pods' bootstrap-port annotation. "" means
	// DefaultBootstrapPortAnnotation.
	BootstrapPortAnnotation string
	// ModelIDLabel names the pod label holding the served model id. "" (or a pod without it)
	// means the model is learned from the worker's /v1/models.
	ModelIDLabel string
	// InferencePool, when set, names an inference.networking.k8s.io/v1 InferencePool in
	// Namespace whose spec.selector.matchLabels and spec.targetPorts replace Selector and Port.
	InferencePool string
	// Reconcilers is how many registrations may run at once. 0 means 4.
	Reconcilers int
	// Logger receives discovery's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	if c.Namespace == "" {
		return errors.New("service discovery: no namespace")
	}
	if len(c.Selector) == 0 && len(c.PrefillSelector) == 0 && len(c.DecodeSelector) == 0 && c.InferencePool == "" {
		return errors.New("service discovery: give --selector, --prefill-selector/--decode-selector or --inference-pool")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("service discovery: port %d is not a port", c.Port)
	}
	for _, s := range []map[string]string{c.Selector, c.PrefillSelector, c.DecodeSelector} {
		if _, err := labels.ValidatedSelectorFromSet(s); err != nil {
			return fmt.Errorf("service discovery: selector: %w", err)
		}
	}
	return nil
}

// Registration is one worker discovery asks for: one port of one pod, with what the pod's labels
// and annotations say about it.
type Registration struct {
	// URL is the worker's base URL, http://POD_IP:PORT.
	URL string
	// ModelID is the served model from the pod's model-id label; "" means the registrar learns it
	// from the worker (its /v1/models).
	ModelID string
	// Type is regular, prefill or decode, from the selector that matched.
	Type worker.Type
	// BootstrapPort is a prefill pod's KV bootstrap port; nil when it has none.
	BootstrapPort *int
	// Labels are the pod's kvgate.io/ annotations without the prefix (policy, breaker and health
	// settings); nil when it has none.
	Labels map[string]string
	// Runtime is the kvgate.io/runtime annotation (sglang, vllm); "" means detected.
	Runtime string
	// Source is "kubernetes:NAMESPACE/POD", recorded on the worker so that the admin API
	// refuses to delete it while its pod exists.
	Source string
}

// Registrar is what discovery changes: a registration path that probes and validates a worker
// before adding it, and removes (drains) a worker it added. The command wires the gateway's
// admin registration to it.
type Registrar interface {
	// Register adds the worker, or fails; an error wrapping ErrRejected says that the
	// registration itself is invalid, so that retrying it cannot help.
	Register(ctx context.Context, r Registration) (*worker.Worker, error)
	// Remove drains and removes the worker of that id.
	Remove(id string) (*worker.Worker, error)
}

// ErrRejected marks a registration that is invalid as it stands (a pod annotation that does not
// parse): discovery waits for the pod to change instead of retrying it.
var ErrRejected = errors.New("registration rejected")

// Discovery keeps a gateway's workers in step with the pods of one namespace. Create it with
// New, then Start and Stop.
type Discovery struct {
	cfg    Config
	log    *slog.Logger
	reg    Registrar
	client dynamic.Interface

	podInformer cache.SharedIndexInformer
	pool        *poolWatch
	queue       workqueue.TypedRateLimitingInterface[string]
	// roles is the current selector set; replaced (never mutated) when the InferencePool changes.
	roles atomic.Pointer[roles]

	mu sync.Mutex
	// owned maps a pod key to the registrations made for it, one per port.
	owned map[string][]registration

	stop func()
	wg   sync.WaitGroup
}

// registration is one worker that discovery registered for a pod.
type registration struct {
	req Registration
	id  string
}

// New returns a Discovery that reads pods (and the InferencePool, when cfg.InferencePool is set)
// with client and registers their workers with reg.
func New(cfg Config, client dynamic.Interface, reg Registrar) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil || reg == nil {
		return nil, errors.New("service discovery: no Kubernetes client or no registrar")
	}
	cfg.Port = cmp.Or(cfg.Port, DefaultPort)
	cfg.BootstrapPortAnnotation = cmp.Or(cfg.BootstrapPortAnnotation, DefaultBootstrapPortAnnotation)
	if cfg.Reconcilers <= 0 {
		cfg.Reconcilers = 4
	}
	d := &Discovery{cfg: cfg, log: cfg.Logger, reg: reg, client: client, owned: map[string][]registration{}}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.log = d.log.With("component", "discovery", "namespace", cfg.Namespace)
	d.roles.Store(rolesFromConfig(&cfg))
	// A pod that failed to register is retried at 0.5 s, 1 s, 2 s, ... up to 30 s: long enough
	// not to hammer a worker that is still loading, short enough to notice it soon.
	d.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second))
	d.podInformer = newInformer(client, PodsGVR, cfg.Namespace, nil)
	if err := d.podInformer.SetTransform(slimPod); err != nil {
		return nil, err
	}
	if _, err := d.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.enqueue,
		UpdateFunc: func(_, obj any) { d.enqueue(obj) },
		DeleteFunc: d.enqueue,
	}); err != nil {
		return nil, err
	}
	if cfg.InferencePool != "" {
		pw, err := newPoolWatch(client, cfg.Namespace, cfg.InferencePool, d.log, d.setPool)
		if err != nil {
			return nil, err
		}
		d.pool = pw
	}
	return d, nil
}

// Start checks that the pods (and the InferencePool) can be listed, starts the informers, waits
// until their caches have synced, and starts the reconcilers. A missing permission fails here,
// with the reason, rather than as an endless stream of watch errors. ctx bounds the start only:
// discovery then runs until Stop.
func (d *Discovery) Start(ctx context.Context) error {
	if _, err := d.client.Resource(PodsGVR).Namespace(d.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("service discovery: listing pods in namespace %q: %w", d.cfg.Namespace, err)
	}
	if d.pool != nil {
		if err := d.pool.check(ctx); err != nil {
			return err
		}
	}
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = cancel
	informers := []cache.SharedIndexInformer{d.podInformer}
	if d.pool != nil {
		informers = append(informers, d.pool.informer)
	}
	var synced []cache.InformerSynced
	for _, inf := range informers {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			inf.RunWithContext(run)
		}()
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		d.Stop()
		return fmt.Errorf("service discovery: caches did not sync: %w", context.Cause(ctx))
	}
	for range d.cfg.Reconcilers {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for d.reconcileNext(run) {
			}
		}()
	}
	d.log.Info("service discovery started", "selectors", d.roles.Load().String())
	return nil
}

// Stop ends the informers and reconcilers and waits for them. Workers already registered stay:
// the gateway is shutting down, and its in-flight requests still need them.
func (d *Discovery) Stop() {
	if d.stop == nil {
		return
	}
	d.stop()
	d.queue.ShutDown()
	d.wg.Wait()
}

// newInformer returns an informer over one resource of one namespace, read as unstructured
// objects; tweak, when set, narrows each list and watch (a field selector).
func newInformer(client dynamic.Interface, gvr schema.GroupVersionResource, namespace string, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	res := client.Resource(gvr).Namespace(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if tweak != nil {
				tweak(&o)
			}
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if tweak != nil {
				tweak(&o)
			}
			return res.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ObjectDescription: gvr.String()})
}

func (d *Discovery) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		d.queue.Add(key)
	}
}

// setPool installs the selector and ports of the InferencePool (nil: it is gone) and
// re-examines every pod.
func (d *Discovery) setPool(p *poolSpec) {
	old := d.roles.Load()
	r := *old
	if p == nil {
		r.regular, r.ports = nil, nil
		d.log.Warn("InferencePool is gone: its pods are drained", "pool", d.cfg.InferencePool)
	} else {
		r.regular, r.ports = labels.SelectorFromSet(p.matchLabels), p.ports
		d.log.Info("InferencePool", "pool", d.cfg.InferencePool, "selector", r.regular.String(), "ports", p.ports)
	}
	if reflect.DeepEqual(old, &r) {
		return
	}
	d.roles.Store(&r)
	for _, key := range d.podInformer.GetIndexer().ListKeys() {
		d.queue.Add(key)
	}
	d.mu.Lock()
	for key := range d.owned {
		d.queue.Add(key)
	}
	d.mu.Unlock()
}

// reconcileNext handles one queued pod key; false once the queue is shut down.
func (d *Discovery) reconcileNext(ctx context.Context) bool {
	key, quit := d.queue.Get()
	if quit {
		return false
	}
	defer d.queue.Done(key)
	if retry := d.reconcile(ctx, key); retry && ctx.Err() == nil {
		d.queue.AddRateLimited(key)
	} else {
		d.queue.Forget(key)
	}
	return true
}

// reconcile makes the registrations for pod key match the pod; it reports whether to try again.
func (d *Discovery) reconcile(ctx context.Context, key string) (retry bool) {
	var want []Registration
	obj, exists, err := d.podInformer.GetIndexer().GetByKey(key)
	if err == nil && exists {
		want = d.targets(obj.(*corev1.Pod), d.roles.Load())
	}
	d.mu.Lock()
	have := d.owned[key]
	var keep, drop []registration
	for _, r := range have {
		if slices.ContainsFunc(want, func(a Registration) bool { return sameRequest(a, r.req) }) {
			keep = append(keep, r)
		} else {
			drop = append(drop, r)
		}
	}
	d.setOwned(key, keep)
	d.mu.Unlock()

	for _, r := range drop {
		if w, err := d.reg.Remove(r.id); err == nil {
			d.log.Info("worker drained", "pod", key, "worker", w.ID, "url", w.Spec.URL, "inflight", w.Inflight())
		}
	}
	for _, a := range want {
		if slices.ContainsFunc(keep, func(r registration) bool { return sameRequest(a, r.req) }) {
			continue
		}
		w, err := d.reg.Register(ctx, a)
		if err != nil {
			if errors.Is(err, ErrRejected) {
				// The pod's annotations do not parse: no retry until the pod changes.
				d.log.Warn("pod not registered: bad settings", "pod", key, "url", a.URL, "err", err)
				continue
			}
			lvl := slog.LevelWarn
			if d.queue.NumRequeues(key) > 0 {
				lvl = slog.LevelDebug // said once; the retries are quiet
			}
			d.log.Log(ctx, lvl, "pod not registered yet; retrying", "pod", key, "url", a.URL, "err", err)
			retry = true
			continue
		}
		keep = append(keep, registration{req: a, id: w.ID})
		d.mu.Lock()
		d.setOwned(key, keep)
		d.mu.Unlock()
	}
	return retry
}

// setOwned records the registrations of pod key; d.mu must be held.
func (d *Discovery) setOwned(key string, rs []registration) {
	if len(rs) == 0 {
		delete(d.owned, key)
		return
	}
	d.owned[key] = slices.Clone(rs)
}

// sameRequest compares two registrations by everything that makes the worker.
func sameRequest(a, b Registration) bool {
	return a.URL == b.URL && a.ModelID == b.ModelID && a.Type == b.Type &&
		a.Runtime == b.Runtime && reflect.DeepEqual(a.BootstrapPort, b.BootstrapPort) && maps.Equal(a.Labels, b.Labels)
}

// Owned returns how many workers discovery has registered and not removed.
func (d *Discovery) Owned() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, rs := range d.owned {
		n += len(rs)
	}
	return n
}
