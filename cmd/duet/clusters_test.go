package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc/accesslog"
)

// envoy.clusters: the defaults are the clusters the bootstrap renders;
// other names reach the access-log reader, and `duet envoy-config` refuses
// them (its bootstrap could not match them).
func TestEnvoyClusters(t *testing.T) {
	const engines = "prefill: [{url: \"http://10.0.0.1:30000\"}]\ndecode: [{url: \"http://10.0.0.2:30000\"}]\n"
	tests := []struct {
		name      string
		yaml      string
		want      accesslog.Clusters
		renderErr string
	}{
		{"defaults", engines, accesslog.DefaultClusters, ""},
		{"explicit defaults", engines + "envoy: {clusters: {decode: duet_decode, prefill: duet_prefill}}\n", accesslog.DefaultClusters, ""},
		{"Envoy Gateway's names", engines + "envoy: {clusters: {decode: httproute/inference/duet/rule/0, prefill: httproute/inference/duet/rule/0-mirror-0}}\n",
			accesslog.Clusters{Decode: "httproute/inference/duet/rule/0", Prefill: "httproute/inference/duet/rule/0-mirror-0"},
			"envoy.clusters: the bootstrap names its clusters duet_decode and duet_prefill"},
		{"prefill renamed", engines + "envoy: {clusters: {prefill: mirror}}\n",
			accesslog.Clusters{Decode: contract.ClusterDecode, Prefill: "mirror"}, "envoy.clusters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.yaml)
			if got := feedbackClusters(cfg); len(got) != 1 || got[0] != tt.want {
				t.Errorf("feedbackClusters = %+v, want %+v", got, tt.want)
			}
			var out bytes.Buffer
			err := run(context.Background(), []string{"envoy-config", "-config", writeConfig(t, tt.yaml)}, &out, io.Discard)
			if tt.renderErr == "" {
				if err != nil {
					t.Fatalf("envoy-config: %v", err)
				}
				if !strings.Contains(out.String(), "cluster_header: x-duet-mirror") || !strings.Contains(out.String(), "- name: "+contract.ClusterPrefill) {
					t.Errorf("bootstrap lacks the mirror or the %s cluster", contract.ClusterPrefill)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.renderErr) {
				t.Errorf("envoy-config error = %v, want one containing %q", err, tt.renderErr)
			}
		})
	}
}
