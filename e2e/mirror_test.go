package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// bareMirrorConfig is a minimal Envoy bootstrap (no ext_proc, no stripping)
// that mirrors to the cluster named by the client's x-mirror header.
const bareMirrorConfig = `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: %[1]d}}}
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %[2]d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bare
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: main
                  request_mirror_policies:
                  - cluster_header: x-mirror
  clusters:
  - name: main
    load_assignment: {cluster_name: main, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[3]d}}}}]}]}
  - name: mirror
    load_assignment: {cluster_name: mirror, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[4]d}}}}]}]}
`

// Claim: a mirror whose cluster_header names a cluster Envoy does not have
// is dropped silently: the main request succeeds and nothing reports it. In
// PD that would leave decode waiting for KV, which is why duet only ever
// names the prefill cluster that envoy-config rendered.
func TestMirrorToUnknownClusterIsDroppedSilently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	main, err := harness.StartSim(ctx, dir, "main", "null", harness.SimSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer main.Stop(5 * time.Second)
	mirror, err := harness.StartSim(ctx, dir, "mirror", "null", harness.SimSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Stop(5 * time.Second)
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	mainPort, mirrorPort := portOf(t, main), portOf(t, mirror)
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(bareMirrorConfig, ports[0], ports[1], mainPort, mirrorPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	envoy, err := harness.StartEnvoy(ctx, dir, cfg, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Stop(5 * time.Second)
	s := &harness.Stack{EnvoyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), EnvoyAdminURL: adminURL}

	body := []byte(`{"model":"sim-model","prompt":"hi","max_tokens":2}`)
	for i, target := range []string{"mirror", "no-such-cluster"} {
		id := requestID(t, i)
		resp, out := send(t, s, "POST", "/v1/completions", map[string]string{"x-request-id": id, "x-mirror": target}, body)
		if resp.StatusCode != 200 {
			t.Fatalf("x-mirror %s: main request status %d: %s", target, resp.StatusCode, out)
		}
		want := 1
		if target != "mirror" {
			want = 0
		}
		legs(t, []*harness.Sim{main}, id, 1)
		if want == 1 {
			legs(t, []*harness.Sim{mirror}, id, 1)
		} else {
			time.Sleep(300 * time.Millisecond) // give a (wrong) mirror time to show up
			legs(t, []*harness.Sim{mirror}, id, 0)
		}
	}
	if n := stat(t, s, "cluster.mirror.upstream_rq_total"); n != 1 {
		t.Errorf("mirror cluster got %d requests, want 1", n)
	}
}

func portOf(t *testing.T, sim *harness.Sim) int {
	t.Helper()
	var port int
	if _, err := fmt.Sscanf(sim.Address, "127.0.0.1:%d", &port); err != nil {
		t.Fatalf("address %q: %v", sim.Address, err)
	}
	return port
}
