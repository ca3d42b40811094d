package istio

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// gatewayHosts reads whether the gateway's Envoy may pick each host (by
// address) of its two clusters to duet.
func gatewayHosts(t *testing.T, s *harness.Stack) map[string]map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := harness.EnvoyHostsHealthy(ctx, s.EnvoyAdminURL, "duet_extproc", "duet_feedback")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Istio's generated gateway configuration on the real Envoy, in front of two
// duet replicas that share their state through nats-server, each behind
// its own sidecar (Istio's generated inbound configuration for duet's pod,
// with the mesh's mutual TLS and auth.yaml's policy), as the headless
// Service of replicas.yaml gives the gateway every replica:
//   - both clusters to duet hold both replicas, healthy: the gRPC health
//     checks pass duet's sidecars, by the gateway's identity;
//   - both replicas route requests, every request is served, and every
//     access-log entry is believed, whichever replica receives it;
//   - replica 1's duet killed with SIGKILL, its sidecar alive (a crashed
//     container in its pod): the gateway skips it on both clusters within a
//     second (its sidecar answers the health checks for a duet that is
//     gone); requests in that second are served or fail at once, and all of
//     them after it are served;
//   - restarted, it is healthy on both clusters again and hears its peer.
//
// NATS itself runs outside the test's mesh here: its place in the mesh is
// TestNATSInTheMesh's, and the sharing is duet's own tests'.
func TestIstioGatewayReplicas(t *testing.T) {
	tools := findIstioTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca, gatewayID, duetID := newMesh(t, dir)
	nats, err := harness.StartNATS(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nats.Stop(time.Second) })
	var sidecars []*sidecar
	attempt := 0
	s, err := harness.Start(ctx, harness.Options{
		Prefill:      []harness.SimSpec{{DPSize: 2}},
		Decode:       []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		Dir:          dir,
		DuetReplicas: 2,
		Auth:         harness.AuthNone,
		DuetYAML:     fmt.Sprintf("auth:\n  unauthenticated: true\nsync:\n  nats:\n    url: %s\n  heartbeat: 200ms\n", nats.URL),
		Bootstrap: func(ctx context.Context, addrs harness.Addresses) ([]byte, error) {
			attempt++
			sidecars = nil
			var listens []string
			for i, grpc := range addrs.EnvoyDuetReplicas {
				sc, err := startSidecar(ctx, t, tools, filepath.Join(dir, fmt.Sprintf("sidecar-%d-%d", attempt, i)), grpc, ca, duetID)
				if err != nil {
					return nil, fmt.Errorf("duet replica %d's sidecar: %w", i, err)
				}
				sidecars, listens = append(sidecars, sc), append(listens, sc.Listen)
			}
			return liveBootstrap(ctx, tools, dir, addrs, listens, ca, gatewayID)
		},
	})
	if err != nil {
		t.Fatalf("start two duet replicas behind Istio's gateway configuration (files in %s): %v", dir, err)
	}
	t.Cleanup(func() { s.CloseLoggingIfFailed(t) })
	if len(sidecars) != 2 {
		t.Fatalf("%d sidecars, want one per replica", len(sidecars))
	}

	for i := range s.Duets {
		harness.WaitFor(t, 10*time.Second, fmt.Sprintf("replica %d hears its peer", i), func() bool { return s.ReplicaMetric(i, "duet_sync_peers", nil) == 1 })
	}
	healthy := func(want map[string]bool) func() bool {
		return func() bool {
			for _, hosts := range gatewayHosts(t, s) {
				if len(hosts) != len(want) {
					return false
				}
				for addr, ok := range want {
					if hosts[addr] != ok {
						return false
					}
				}
			}
			return true
		}
	}
	both := map[string]bool{sidecars[0].Listen: true, sidecars[1].Listen: true}
	harness.WaitFor(t, 10*time.Second, "both clusters to duet hold both replicas, healthy through their sidecars", healthy(both))

	client := &http.Client{Timeout: 30 * time.Second}
	const requests = 12
	for i := range requests {
		if r := harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8); r.Outcome != harness.OutcomeServed {
			t.Fatalf("request %d: %s %d %s", i, r.Outcome, r.Status, r.Detail)
		}
	}
	entries := 0.0
	for i := range s.Duets {
		if n := s.ReplicaMetric(i, "duet_extproc_requests_total", nil); n <= 0 {
			t.Errorf("replica %d routed no request: the gateway does not spread ext_proc streams over the replicas", i)
		}
		if n := s.ReplicaMetric(i, "duet_feedback_untrusted_total", nil); n != 0 {
			t.Errorf("replica %d did not believe %v access-log entries", i, n)
		}
		entries += s.ReplicaMetric(i, "duet_feedback_entries_total", nil)
	}
	if entries != 3*requests {
		t.Errorf("the replicas received %v access-log entries, want %d (a request's and each leg's)", entries, 3*requests)
	}

	// Replica 1's duet dies; its sidecar lives on and answers for it.
	killed := time.Now()
	s.Duets[1].Kill()
	var mu sync.Mutex
	var during []harness.Result
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8)
			mu.Lock()
			during = append(during, r)
			mu.Unlock()
		}
	}()
	harness.WaitFor(t, 5*time.Second, "the gateway skips the dead replica on both clusters", healthy(map[string]bool{sidecars[0].Listen: true, sidecars[1].Listen: false}))
	skipped := time.Since(killed)
	close(stop)
	<-done
	t.Logf("the dead replica was skipped on both clusters %v after SIGKILL", skipped.Round(time.Millisecond))
	if skipped > time.Second {
		t.Errorf("the dead replica was skipped after %v, want within a second", skipped)
	}
	failed := 0
	for _, r := range during {
		switch {
		case r.Outcome == harness.OutcomeServed:
		case r.Outcome == harness.OutcomeError && r.Wait <= time.Second:
			failed++
		default:
			t.Errorf("request %s before the dead replica was skipped: %s %d after %v: %s", r.ID, r.Outcome, r.Status, r.Wait, r.Detail)
		}
	}
	t.Logf("%d requests until the dead replica was skipped: %d failed at once (its sidecar's 503), the rest served", len(during), failed)
	for i := 200; i < 206; i++ {
		if r := harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8); r.Outcome != harness.OutcomeServed {
			t.Errorf("request %d after the dead replica was skipped: %s %d %s", i, r.Outcome, r.Status, r.Detail)
		}
	}

	if err := s.RestartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the restarted replica is healthy on both clusters again", healthy(both))
	harness.WaitFor(t, 10*time.Second, "the restarted replica hears its peer", func() bool { return s.ReplicaMetric(1, "duet_sync_peers", nil) == 1 })
	for i := 300; i < 306; i++ {
		if r := harness.Chat(ctx, client, s.EnvoyURL, i, i%2 == 0, 8); r.Outcome != harness.OutcomeServed {
			t.Errorf("request %d after the restart: %s %d %s", i, r.Outcome, r.Status, r.Detail)
		}
	}
	for i, sc := range sidecars {
		if rbac := sidecarRBAC(t, sc); rbac["allowed"] == 0 || rbac["denied"] != 0 {
			t.Errorf("replica %d's sidecar RBAC: %v, want only allowed streams (the gateway's)", i, rbac)
		}
	}
}
