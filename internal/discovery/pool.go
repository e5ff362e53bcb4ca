package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// InferencePoolGVR is the Gateway API Inference Extension's InferencePool resource. It is read
// as unstructured data: the two fields discovery needs do not justify the extension's module.
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// poolSpec is what discovery takes from an InferencePool.
type poolSpec struct {
	matchLabels map[string]string
	ports       []int
}

// parsePool reads spec.selector.matchLabels and spec.targetPorts[].number. A pool without a
// selector or a valid port is an error: following it would silently drain every worker.
func parsePool(u *unstructured.Unstructured) (*poolSpec, error) {
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || !found || len(ml) == 0 {
		return nil, errors.New("InferencePool has no spec.selector.matchLabels")
	}
	tps, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil || !found || len(tps) == 0 {
		return nil, errors.New("InferencePool has no spec.targetPorts")
	}
	p := &poolSpec{matchLabels: ml}
	for _, tp := range tps {
		m, ok := tp.(map[string]any)
		if !ok {
			return nil, errors.New("InferencePool spec.targetPorts holds a non-object")
		}
		n, found, err := unstructured.NestedInt64(m, "number")
		if err != nil || !found || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("InferencePool spec.targetPorts[].number %v is not a port", m["number"])
		}
		if !slices.Contains(p.ports, int(n)) {
			p.ports = append(p.ports, int(n))
		}
	}
	return p, nil
}

// poolWatch follows one InferencePool by name.
type poolWatch struct {
	client    dynamic.Interface
	namespace string
	name      string
	informer  cache.SharedIndexInformer
}

func newPoolWatch(client dynamic.Interface, namespace, name string, log *slog.Logger, set func(*poolSpec)) (*poolWatch, error) {
	pw := &poolWatch{client: client, namespace: namespace, name: name}
	pw.informer = newInformer(client, InferencePoolGVR, namespace, func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + name
	})
	apply := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() != name {
			return
		}
		p, err := parsePool(u)
		if err != nil {
			// Keep following the last good spec rather than draining the fleet on a bad edit.
			log.Warn("ignoring an InferencePool update", "pool", name, "err", err)
			return
		}
		set(p)
	}
	_, err := pw.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok && u.GetName() == name {
				set(nil)
			}
		},
	})
	return pw, err
}

// check fails when the pool cannot be read (no CRD, no permission); a pool not yet created is
// fine: its pods join when it appears.
func (pw *poolWatch) check(ctx context.Context) error {
	_, err := pw.client.Resource(InferencePoolGVR).Namespace(pw.namespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + pw.name, Limit: 1})
	if err != nil {
		return fmt.Errorf("service discovery: listing InferencePool %q in namespace %q: %w", pw.name, pw.namespace, err)
	}
	return nil
}
