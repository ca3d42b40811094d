package config

import "testing"

// The duet.yaml of deploy/envoy-gateway/pools loads: two pools found
// through Kubernetes, a PD one and an aggregated one, each with Envoy
// Gateway's cluster names for its rule of the one HTTPRoute (the names
// e2e/envoygateway proves against egctl's translation). The aggregated
// pool's vLLM engines serve no /server_info, so its Service gives their DP
// size (dp_size 2); the SGLang Services leave it to discovery.
func TestEnvoyGatewayPoolsConfigMap(t *testing.T) {
	cfg, err := Parse([]byte(configMapText(t, "../../../../deploy/envoy-gateway/pools/duet.yaml")))
	if err != nil {
		t.Fatalf("the ConfigMap's duet.yaml: %v", err)
	}
	pools := cfg.PoolList()
	if len(pools) != 2 {
		t.Fatalf("%d pools, want 2", len(pools))
	}
	for i, want := range []struct {
		pd              bool
		decode, prefill string
		decodeDP        int
	}{
		{true, "httproute/inference/duet/rule/0", "httproute/inference/duet/rule/0-mirror-0", 0},
		{false, "httproute/inference/duet/rule/1", "", 2},
	} {
		p := pools[i]
		if p.PD() != want.pd || p.Kubernetes == nil {
			t.Errorf("pool %s: PD %v, Kubernetes %+v; want PD %v through Kubernetes", p.Name, p.PD(), p.Kubernetes, want.pd)
			continue
		}
		if p.Kubernetes.Decode == nil || p.Kubernetes.Decode.DPSize != want.decodeDP {
			t.Errorf("pool %s: decode Service %+v, want dp_size %d", p.Name, p.Kubernetes.Decode, want.decodeDP)
		}
		if p.Kubernetes.Prefill != nil && p.Kubernetes.Prefill.DPSize != 0 {
			t.Errorf("pool %s: prefill dp_size %d, want 0 (SGLang's /server_info gives it)", p.Name, p.Kubernetes.Prefill.DPSize)
		}
		if p.Clusters.Decode != want.decode || (want.prefill != "" && p.Clusters.Prefill != want.prefill) {
			t.Errorf("pool %s: clusters %+v, want decode %s prefill %s", p.Name, p.Clusters, want.decode, want.prefill)
		}
	}
	if cfg.Listen.GRPC != "0.0.0.0:9002" {
		t.Errorf("listen.grpc = %q, want 0.0.0.0:9002 (the Service's port)", cfg.Listen.GRPC)
	}
}
