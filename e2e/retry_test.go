package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// retryRoute is the retry policy duet renders for its decode route.
const retryRoute = `                  cluster: pool
                  retry_policy:
                    retry_on: connect-failure,reset-before-request
                    num_retries: 1`

// retryPool is a cluster of two hosts (%[1]d dead, %[2]d alive) chosen by
// override_host from header x-host, as duet's engine clusters are.
const retryPool = `  - name: pool
    connect_timeout: 1s
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[1]d}}}
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[2]d}}}
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources: [{header: x-host}]
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.least_request
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest`

// Claim: with override_host, a comma-separated host list and a
// connect-failure retry, a request whose first host refuses the connection
// is retried once on the next listed host, before any byte reached an
// engine. With a single listed host, the retry goes to override_host's
// fallback policy, and the client is answered at once either way.
func TestOverrideHostRetriesOnNextListedHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	alive, err := harness.StartSim(ctx, dir, "alive", "null", harness.SimSpec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alive.Stop(5 * time.Second) })
	ports, err := harness.FreePorts(1) // a port nobody listens on
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("127.0.0.1:%d", ports[0])
	s := startBareEnvoy(ctx, t, dir, retryRoute, fmt.Sprintf(retryPool, ports[0], portOf(t, alive)))

	body := []byte(`{"model":"sim-model","prompt":"hi","max_tokens":2}`)
	id := requestID(t, 0)
	start := time.Now()
	resp, out := send(t, s, "POST", "/v1/completions", map[string]string{"x-request-id": id, "x-host": dead + "," + alive.Address}, body)
	if resp.StatusCode != 200 {
		t.Fatalf("dead,alive: status %d: %s", resp.StatusCode, out)
	}
	legs(t, []*harness.Sim{alive}, id, 1)
	t.Logf("dead,alive: served by the second host after %v", time.Since(start))
	if n := stat(t, s, "cluster.pool.upstream_rq_retry"); n != 1 {
		t.Errorf("upstream_rq_retry = %d, want 1", n)
	}

	// With one listed host the retry has no next host: override_host hands
	// it to its fallback policy, which picks any host of the cluster (the
	// dead one again, or the live one). Either way the client is answered
	// at once, never left waiting.
	for i := 1; i <= 6; i++ {
		id = requestID(t, i)
		start = time.Now()
		resp, out = send(t, s, "POST", "/v1/completions", map[string]string{"x-request-id": id, "x-host": dead}, body)
		took := time.Since(start)
		if resp.StatusCode != 503 && resp.StatusCode != 200 {
			t.Fatalf("dead only: status %d, want 503 or 200 from the fallback policy: %s", resp.StatusCode, out)
		}
		if took > 2*time.Second {
			t.Errorf("dead only: answered after %v, want it fast", took)
		}
	}
}
