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

// bareEnvoy is a minimal Envoy bootstrap without duet: admin on port %[1]d,
// a listener on %[2]d whose one route (%[3]s, the fields under "route:")
// covers every path, and the clusters %[4]s.
const bareEnvoy = `
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
%[3]s
  clusters:
%[4]s
`

// bareMirrorClusters are startBare's clusters: main (engine port %[1]d,
// extra options %[3]s) and mirror (engine port %[2]d).
const bareMirrorClusters = `  - name: main
    load_assignment: {cluster_name: main, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[1]d}}}}]}]}
%[3]s
  - name: mirror
    load_assignment: {cluster_name: mirror, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[2]d}}}}]}]}`

// startBareEnvoy writes bareEnvoy with route and clusters into dir and
// starts Envoy on it; it stops when the test ends. The returned stack has
// only the Envoy URLs set.
func startBareEnvoy(ctx context.Context, t *testing.T, dir, route, clusters string) *harness.Stack {
	t.Helper()
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(bareEnvoy, ports[0], ports[1], route, clusters)), 0o644); err != nil {
		t.Fatal(err)
	}
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	envoy, err := harness.StartEnvoy(ctx, dir, cfg, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { envoy.Stop(5 * time.Second) })
	return &harness.Stack{EnvoyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), EnvoyAdminURL: adminURL}
}

// startBare starts two aggregated engines, "main" and "mirror" (dp as
// given), and a bare Envoy from bareEnvoy with the mirror policy and the
// main cluster's extra options; everything stops when the test ends.
func startBare(t *testing.T, dp int, mirrorPolicy, mainOptions string) (s *harness.Stack, main, mirror *harness.Sim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	var err error
	for _, sim := range []struct {
		name string
		dst  **harness.Sim
	}{{"main", &main}, {"mirror", &mirror}} {
		if *sim.dst, err = harness.StartSim(ctx, dir, sim.name, "null", harness.SimSpec{DPSize: dp}); err != nil {
			t.Fatal(err)
		}
		p := *sim.dst
		t.Cleanup(func() { p.Stop(5 * time.Second) })
	}
	route := fmt.Sprintf("                  cluster: main\n                  request_mirror_policies: [%s]", mirrorPolicy)
	clusters := fmt.Sprintf(bareMirrorClusters, portOf(t, main), portOf(t, mirror), mainOptions)
	return startBareEnvoy(ctx, t, dir, route, clusters), main, mirror
}

// Claim: a mirror whose cluster_header names a cluster Envoy does not have
// is dropped silently: the main request succeeds and nothing reports it. In
// PD that would leave decode waiting for KV, which is why duet only ever
// names the prefill cluster that envoy-config rendered.
func TestMirrorToUnknownClusterIsDroppedSilently(t *testing.T) {
	s, main, mirror := startBare(t, 1, "{cluster_header: x-mirror}", "")

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
