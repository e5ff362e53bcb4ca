package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/discovery"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/worker"
)

// discoveryOptions are the Kubernetes service-discovery flags.
type discoveryOptions struct {
	enabled             bool
	kubeconfig          string
	namespace           string
	port                string
	selector            listFlag
	prefill, decode     listFlag
	bootstrapAnnotation string
	modelIDLabel        string
	inferencePool       string
}

func addDiscoveryFlags(fs *flag.FlagSet, o *discoveryOptions) {
	fs.BoolVar(&o.enabled, "service-discovery", false, "find workers among Kubernetes pods (in-cluster config, or --kubeconfig)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "service discovery: kubeconfig file (empty = in-cluster config)")
	fs.StringVar(&o.namespace, "service-discovery-namespace", "", "service discovery: namespace watched (default: the gateway pod's own)")
	fs.StringVar(&o.port, "service-discovery-port", strconv.Itoa(discovery.DefaultPort), "service discovery: worker port, a number or a container port name")
	fs.Var(&o.selector, "selector", "service discovery: KEY=VALUE labels a regular worker pod has (all of them)")
	fs.Var(&o.prefill, "prefill-selector", "service discovery: KEY=VALUE labels of prefill pods")
	fs.Var(&o.decode, "decode-selector", "service discovery: KEY=VALUE labels of decode pods")
	fs.StringVar(&o.bootstrapAnnotation, "bootstrap-port-annotation", discovery.DefaultBootstrapPortAnnotation, "service discovery: pod annotation holding a prefill worker's bootstrap port")
	fs.StringVar(&o.modelIDLabel, "model-id-label", "", "service discovery: pod label holding the model id (empty or absent: learned from /v1/models)")
	fs.StringVar(&o.inferencePool, "inference-pool", "", "service discovery: follow this InferencePool (inference.networking.k8s.io/v1) for the selector and ports")
}

// config turns the flags into a discovery.Config.
func (o *discoveryOptions) config(log *slog.Logger) (discovery.Config, error) {
	c := discovery.Config{Namespace: o.namespace, BootstrapPortAnnotation: o.bootstrapAnnotation,
		ModelIDLabel: o.modelIDLabel, InferencePool: o.inferencePool, Logger: log}
	if n, err := strconv.Atoi(o.port); err == nil {
		c.Port = n
	} else {
		c.PortName = o.port
	}
	var err error
	for _, s := range []struct {
		flag string
		in   listFlag
		out  *map[string]string
	}{{"selector", o.selector, &c.Selector}, {"prefill-selector", o.prefill, &c.PrefillSelector}, {"decode-selector", o.decode, &c.DecodeSelector}} {
		if *s.out, err = parseSelector(s.in); err != nil {
			return c, fmt.Errorf("--%s: %w", s.flag, err)
		}
	}
	if c.Namespace == "" {
		c.Namespace = ownNamespace(o.kubeconfig)
	}
	return c, c.Validate()
}

func parseSelector(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want KEY=VALUE", p)
		}
		m[k] = v
	}
	return m, nil
}

// ownNamespace is the gateway pod's namespace: $POD_NAMESPACE (the downward API), the service
// account's namespace file, the kubeconfig context's namespace, else "default".
func ownNamespace(kubeconfig string) string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b))
	}
	if kubeconfig != "" {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
		if ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).Namespace(); err == nil && ns != "" {
			return ns
		}
	}
	return "default"
}

// startDiscovery connects to the API server and starts discovery feeding gw; the returned stop
// ends it. It fails at once on a bad flag, an unreachable API server or a missing permission.
func startDiscovery(ctx context.Context, o *discoveryOptions, gw *gateway.Server, log *slog.Logger) (stop func(), err error) {
	cfg, err := o.config(log)
	if err != nil {
		return nil, err
	}
	var rc *rest.Config
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("service discovery: %w", err)
	}
	rc.UserAgent = "kvgate"
	klog.SetSlogLogger(log.With("component", "client-go")) // client-go logs through ours
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("service discovery: %w", err)
	}
	d, err := discovery.New(cfg, client, gatewayRegistrar{gw})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.Start(sctx); err != nil {
		return nil, err
	}
	return d.Stop, nil
}

// gatewayRegistrar registers discovered workers through the gateway's admin registration path
// (probe, validation, labels), exactly as POST /workers would, and drains them through its
// registry.
type gatewayRegistrar struct{ gw *gateway.Server }

var _ discovery.Registrar = gatewayRegistrar{}

func (g gatewayRegistrar) Register(ctx context.Context, r discovery.Registration) (*worker.Worker, error) {
	w, err := g.gw.Register(ctx, gateway.AddWorkerRequest{URL: r.URL, ModelID: r.ModelID, WorkerType: r.Type.String(),
		BootstrapPort: r.BootstrapPort, Labels: r.Labels, Runtime: r.Runtime, Source: r.Source})
	var re *gateway.RegisterError
	if errors.As(err, &re) && re.Status == http.StatusBadRequest {
		return nil, fmt.Errorf("%w: %w", discovery.ErrRejected, err)
	}
	return w, err
}

func (g gatewayRegistrar) Remove(id string) (*worker.Worker, error) {
	return g.gw.Registry().Remove(id)
}
