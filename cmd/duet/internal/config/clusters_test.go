package config

import (
	"strings"
	"testing"
)

// TestParseEnvoyClusters: envoy.clusters defaults to the names `duet
// envoy-config` renders, takes a gateway's own names (one or both), and
// refuses one cluster for both roles.
func TestParseEnvoyClusters(t *testing.T) {
	const eg = "httproute/inference/duet/rule/0"
	tests := []struct {
		name        string
		yaml        string
		wantDecode  string
		wantPrefill string
		wantErr     string
	}{
		{"defaults", `decode: [{url: "http://a:1"}]`, DefaultDecodeCluster, DefaultPrefillCluster, ""},
		{"both named", `{decode: [{url: "http://a:1"}], envoy: {clusters: {decode: "` + eg + `", prefill: "` + eg + `-mirror-0"}}}`,
			eg, eg + "-mirror-0", ""},
		{"prefill only", `{decode: [{url: "http://a:1"}], envoy: {clusters: {prefill: mirror}}}`, DefaultDecodeCluster, "mirror", ""},
		{"same cluster for both", `{decode: [{url: "http://a:1"}], envoy: {clusters: {decode: x, prefill: x}}}`, "", "",
			`envoy.clusters: decode and prefill are both "x"`},
		{"default name for the other role", `{decode: [{url: "http://a:1"}], envoy: {clusters: {decode: duet_prefill}}}`, "", "",
			"envoy.clusters"},
		{"unknown key", `{decode: [{url: "http://a:1"}], envoy: {clusters: {mirror: x}}}`, "", "", "line 1: envoy.clusters.mirror: unknown key; envoy.clusters takes decode, prefill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Envoy.Clusters; got.Decode != tt.wantDecode || got.Prefill != tt.wantPrefill {
				t.Errorf("envoy.clusters = %+v, want decode %q, prefill %q", got, tt.wantDecode, tt.wantPrefill)
			}
		})
	}
}
