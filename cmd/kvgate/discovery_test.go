package main

import (
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestDiscoveryFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "from-env")
	for _, tc := range []struct {
		name      string
		args      []string
		ok        bool
		ns        string
		port      int
		portName  string
		selector  map[string]string
		prefill   map[string]string
		modelFrom string
	}{
		{name: "selector pairs", args: []string{"--service-discovery", "--selector", "app=sglang", "tier=gpu", "--model-id-label", "model"},
			ok: true, ns: "from-env", port: 8000, selector: map[string]string{"app": "sglang", "tier": "gpu"}, modelFrom: "model"},
		{name: "named port and namespace", args: []string{"--service-discovery", "--selector=app=x", "--service-discovery-port", "http", "--service-discovery-namespace", "llm"},
			ok: true, ns: "llm", portName: "http", selector: map[string]string{"app": "x"}},
		{name: "prefill only", args: []string{"--service-discovery", "--prefill-selector", "role=prefill", "--decode-selector", "role=decode"},
			ok: true, ns: "from-env", port: 8000, prefill: map[string]string{"role": "prefill"}},
		{name: "inference pool", args: []string{"--service-discovery", "--inference-pool", "llama"}, ok: true, ns: "from-env", port: 8000},
		{name: "nothing selected", args: []string{"--service-discovery"}},
		{name: "bad pair", args: []string{"--service-discovery", "--selector", "app"}},
		{name: "bad label value", args: []string{"--service-discovery", "--selector", "app=a b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseServe(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			c, err := o.disc.config(nil)
			if (err == nil) != tc.ok {
				t.Fatalf("config: err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			if !o.disc.enabled || c.Namespace != tc.ns || c.Port != tc.port || c.PortName != tc.portName || c.ModelIDLabel != tc.modelFrom {
				t.Errorf("got %+v", c)
			}
			if !maps.Equal(c.Selector, tc.selector) || !maps.Equal(c.PrefillSelector, tc.prefill) {
				t.Errorf("selectors: got %v / %v", c.Selector, c.PrefillSelector)
			}
		})
	}
}

// The config file shipped in deploy/'s ConfigMap is one kvgate accepts, and it turns discovery on.
func TestDeployConfigMapParses(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/kubernetes/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(raw), "\n---\n")
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAMESPACE", "llm")
	o, err := parseServe([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.disc.config(nil)
	if err != nil || !o.disc.enabled || c.PortName != "http" || len(c.Selector) != 1 {
		t.Fatalf("discovery from the ConfigMap: %+v, %v", c, err)
	}
}
