package config

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// configMapText returns the duet.yaml of the ConfigMap in the manifest file
// at path.
func configMapText(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var o struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if o.Kind == "ConfigMap" && o.Data["duet.yaml"] != "" {
			return o.Data["duet.yaml"]
		}
	}
	t.Fatalf("%s has no ConfigMap with duet.yaml", path)
	return ""
}

// The duet.yaml that deploy/envoy-gateway's ConfigMap carries loads, with
// Kubernetes discovery and Envoy Gateway's cluster names (the names
// e2e/envoygateway proves against egctl's translation).
func TestEnvoyGatewayConfigMap(t *testing.T) {
	cfg, err := Parse([]byte(configMapText(t, "../../../../deploy/envoy-gateway/duet.yaml")))
	if err != nil {
		t.Fatalf("the ConfigMap's duet.yaml: %v", err)
	}
	if cfg.Kubernetes == nil || cfg.Kubernetes.Prefill == nil || cfg.Kubernetes.Decode == nil {
		t.Errorf("kubernetes section = %+v, want both pools", cfg.Kubernetes)
	}
	if c := cfg.Envoy.Clusters; c.Decode == DefaultDecodeCluster || c.Prefill == DefaultPrefillCluster {
		t.Errorf("envoy.clusters = %+v, want Envoy Gateway's names", c)
	}
	if cfg.Listen.GRPC != "0.0.0.0:9002" {
		t.Errorf("listen.grpc = %q, want 0.0.0.0:9002 (the Service's port)", cfg.Listen.GRPC)
	}
}
