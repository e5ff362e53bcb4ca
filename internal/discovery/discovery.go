// Package discovery finds workers in Kubernetes: it watches the pods of one namespace with
// client-go informers and keeps the gateway's worker registry in step with them (DESIGN.md §7).
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
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// Defaults of DESIGN.md §7.
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

// Gateway is what discovery changes: the gateway's registration path (probe, validation, labels)
// and its registry, which drains a removed worker. *gateway.Server implements it.
type Gateway interface {
	Register(ctx context.Context, a gateway.AddWorkerRequest) (*worker.Worker, error)
	Registry() *worker.Registry
}

// Discovery keeps a gateway's workers in step with the pods of one namespace. Create it with
// New, then Start and Stop.
type Discovery struct {
	cfg   Config
	log   *slog.Logger
	gw    Gateway
	pods  kubernetes.Interface
	pools dynamic.Interface

	factory     informers.SharedInformerFactory
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
	req gateway.AddWorkerRequest
	id  string
}

// New returns a Discovery over the pods client and, when cfg.InferencePool is set, the dynamic
// client the InferencePool is read with (it may be nil otherwise).
func New(cfg Config, pods kubernetes.Interface, pools dynamic.Interface, gw Gateway) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.InferencePool != "" && pools == nil {
		return nil, errors.New("service discovery: --inference-pool needs a dynamic client")
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.BootstrapPortAnnotation == "" {
		cfg.BootstrapPortAnnotation = DefaultBootstrapPortAnnotation
	}
	if cfg.Reconcilers <= 0 {
		cfg.Reconcilers = 4
	}
	d := &Discovery{cfg: cfg, log: cfg.Logger, gw: gw, pods: pods, pools: pools, owned: map[string][]registration{}}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.log = d.log.With("component", "discovery", "namespace", cfg.Namespace)
	d.roles.Store(rolesFromConfig(&cfg))
	// A pod that failed to register is retried at 0.5 s, 1 s, 2 s, ... up to 30 s: long enough
	// not to hammer a worker that is still loading, short enough to notice it soon.
	d.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second))
	d.factory = informers.NewSharedInformerFactoryWithOptions(pods, 0,
		informers.WithNamespace(cfg.Namespace), informers.WithTransform(slimPod))
	d.podInformer = d.factory.Core().V1().Pods().Informer()
	if _, err := d.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.enqueue,
		UpdateFunc: func(_, obj any) { d.enqueue(obj) },
		DeleteFunc: d.enqueue,
	}); err != nil {
		return nil, err
	}
	if cfg.InferencePool != "" {
		pw, err := newPoolWatch(pools, cfg.Namespace, cfg.InferencePool, d.log, d.setPool)
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
	if _, err := d.pods.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("service discovery: listing pods in namespace %q: %w", d.cfg.Namespace, err)
	}
	if d.pool != nil {
		if err := d.pool.check(ctx); err != nil {
			return err
		}
	}
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = cancel
	d.factory.Start(run.Done())
	synced := []cache.InformerSynced{d.podInformer.HasSynced}
	if d.pool != nil {
		d.pool.start(run.Done())
		synced = append(synced, d.pool.informer.HasSynced)
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
	d.factory.Shutdown()
	if d.pool != nil {
		d.pool.factory.Shutdown()
	}
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
	var want []gateway.AddWorkerRequest
	obj, exists, err := d.podInformer.GetIndexer().GetByKey(key)
	if err == nil && exists {
		want = d.targets(obj.(*corev1.Pod), d.roles.Load())
	}
	d.mu.Lock()
	have := d.owned[key]
	var keep, drop []registration
	for _, r := range have {
		if slices.ContainsFunc(want, func(a gateway.AddWorkerRequest) bool { return sameRequest(a, r.req) }) {
			keep = append(keep, r)
		} else {
			drop = append(drop, r)
		}
	}
	d.setOwned(key, keep)
	d.mu.Unlock()

	for _, r := range drop {
		if w, err := d.gw.Registry().Remove(r.id); err == nil {
			d.log.Info("worker drained", "pod", key, "worker", w.ID, "url", w.Spec.URL, "inflight", w.Inflight())
		}
	}
	for _, a := range want {
		if slices.ContainsFunc(keep, func(r registration) bool { return sameRequest(a, r.req) }) {
			continue
		}
		w, err := d.gw.Register(ctx, a)
		if err != nil {
			var re *gateway.RegisterError
			if errors.As(err, &re) && re.Status == http.StatusBadRequest {
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
func sameRequest(a, b gateway.AddWorkerRequest) bool {
	return a.URL == b.URL && a.ModelID == b.ModelID && a.WorkerType == b.WorkerType &&
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
