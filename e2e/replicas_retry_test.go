package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
)

// Claim (issue 17): the grpc_service.retry_policy of the ext_proc filter
// (retry_on connect-failure,refused-stream,reset; another replica each
// time) takes a stream that could not reach its duet replica to another
// replica, so that the request is served rather than failed, and the
// access loggers' (connect-failure,refused-stream) opens a new access-log
// stream that a replica refuses on another one, its first entries with it.
// Proved on the rendered bootstrap without its health checks and outlier
// detection, so that Envoy keeps sending streams to the dead replica (two
// replicas, round robin): replica 1 refuses connections (killed), or takes
// each connection and closes it once a stream arrives (a replica that dies
// before it answers). Without the retry policies, half the requests fail
// with Envoy's 503 and access-log entries are lost.
func TestStreamsRetriedOnAnotherReplica(t *testing.T) {
	for _, tc := range []struct {
		name string
		// retry keeps the retry policies.
		retry bool
		// closing replaces the dead replica with a listener that takes
		// each connection and closes it once a stream arrives.
		closing bool
	}{
		{"refused, retried", true, false},
		{"closed before an answer, retried", true, true},
		{"refused, without the retry policies", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := startStack(t, harness.Options{
				Decode:       []harness.SimSpec{{}},
				DuetReplicas: 2,
				LogLevel:     "info",
				Dir:          dir,
				Bootstrap:    uncheckedBootstrap(dir, tc.retry),
			})
			s.Duets[1].Kill()
			if tc.closing {
				closeOnStream(t, s, s.DuetGRPCs[1])
			}
			const n = 20
			failed := 0
			for i := range n {
				r := do(context.Background(), s, i, i%2 == 1)
				switch {
				case r.Outcome == harness.OutcomeServed:
				case r.Outcome == harness.OutcomeError && r.Status == http.StatusServiceUnavailable && r.Wait < time.Second:
					failed++
				default:
					t.Errorf("request %d: %s (status %d) after %v: %s", i, r.Outcome, r.Status, r.Wait, r.Detail)
				}
			}
			// A served request's two entries (downstream and upstream), and
			// a failed one's downstream entry, are written after its client
			// has its answer: wait for them, so that the count compared
			// below is final.
			var stats map[string]int64
			harness.WaitFor(t, 5*time.Second, "Envoy to write both access-log entries of every request", func() bool {
				var err error
				stats, err = harness.EnvoyCounters(context.Background(), s.EnvoyAdminURL,
					`^(cluster\.duet_extproc\.(upstream_rq_retry|upstream_rq_retry_success|upstream_cx_connect_fail)|cluster\.duet_feedback\.upstream_cx_connect_fail|access_logs\.grpc_access_log\.logs_written)$`)
				if err != nil {
					t.Fatal(err)
				}
				return stats["access_logs.grpc_access_log.logs_written"] >= int64(2*n-failed)
			})
			t.Logf("%d of %d requests failed (fast 503); Envoy: %v", failed, n, stats)
			toDead := stats["cluster.duet_extproc.upstream_rq_retry"]
			if !tc.retry {
				toDead = stats["cluster.duet_extproc.upstream_cx_connect_fail"]
			}
			if toDead < n/4 {
				t.Fatalf("only %d streams went to the dead replica: the run proves nothing", toDead)
			}
			switch {
			case tc.retry && failed > 0:
				t.Errorf("%d requests failed: the retry policy did not take their streams to the live replica", failed)
			case tc.retry && stats["cluster.duet_extproc.upstream_rq_retry_success"] != stats["cluster.duet_extproc.upstream_rq_retry"]:
				t.Errorf("retries %v: not every retry succeeded", stats)
			case tc.closing && stats["cluster.duet_extproc.upstream_cx_connect_fail"] != 0:
				t.Errorf("connect failures %v: the closing replica should have accepted every connection", stats)
			case !tc.retry && failed == 0:
				t.Error("no request failed without the retry policy: the dead replica got no stream")
			}
			if tc.closing {
				return // an access-log stream that a replica cut is not retried
			}
			// Every entry Envoy wrote reaches the live replica, or (without
			// the retry policies) some are lost with the refused streams.
			written := float64(stats["access_logs.grpc_access_log.logs_written"])
			got := func() float64 { return s.ReplicaMetric(0, "duet_feedback_entries_total", nil) }
			switch {
			case tc.retry:
				harness.WaitFor(t, 10*time.Second, "every access-log entry on the live replica", func() bool { return got() == written })
			case stats["cluster.duet_feedback.upstream_cx_connect_fail"] == 0:
				// Envoy keeps an access-log stream for its life (claim 30):
				// when each opened on the live replica at once, no entry
				// could be lost, and there is nothing to compare.
				t.Logf("no access-log stream was opened on the dead replica in this run")
			default:
				if time.Sleep(time.Second); got() >= written {
					t.Errorf("the live replica got all %v access-log entries although %d access-log connections to the dead replica failed without the retry policies",
						written, stats["cluster.duet_feedback.upstream_cx_connect_fail"])
				}
			}
			t.Logf("access-log entries: %v written by Envoy, %v received by the live replica", written, got())
		})
	}
}

// uncheckedBootstrap renders dir/duet.yaml's bootstrap and removes the
// health checks and outlier detection of the clusters to duet (and, unless
// keepRetry, the ext_proc stream's retry policy).
func uncheckedBootstrap(dir string, keepRetry bool) func(context.Context, harness.Addresses) ([]byte, error) {
	return func(ctx context.Context, _ harness.Addresses) ([]byte, error) {
		tools, err := harness.FindTools()
		if err != nil {
			return nil, err
		}
		out, err := exec.CommandContext(ctx, tools.Duet, "envoy-config", "-config", filepath.Join(dir, "duet.yaml")).Output()
		if err != nil {
			return nil, err
		}
		var doc map[string]any
		if err := yaml.Unmarshal(out, &doc); err != nil {
			return nil, err
		}
		static := doc["static_resources"].(map[string]any)
		for _, c := range static["clusters"].([]any) {
			cluster := c.(map[string]any)
			if name := cluster["name"]; name == envoy.ClusterDuet || name == envoy.ClusterFeedback {
				delete(cluster, "health_checks")
				delete(cluster, "outlier_detection")
			}
		}
		if !keepRetry {
			dropRetryPolicies(doc)
		}
		return yaml.Marshal(doc)
	}
}

// dropRetryPolicies removes the retry_policy of every grpc_service in v.
func dropRetryPolicies(v any) {
	switch v := v.(type) {
	case map[string]any:
		if g, ok := v["grpc_service"].(map[string]any); ok {
			delete(g, "retry_policy")
		}
		for _, child := range v {
			dropRetryPolicies(child)
		}
	case []any:
		for _, child := range v {
			dropRetryPolicies(child)
		}
	}
}

// closeOnStream listens at addr with duet's certificate (mutual TLS, ALPN
// h2) and closes each connection once it has carried a few bytes past
// the handshake: the HTTP/2 preface and a stream's headers.
func closeOnStream(t *testing.T, s *harness.Stack, addr string) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(s.Credentials.DuetCertFile, s.Credentials.DuetKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(s.Credentials.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	lis, err := tls.Listen("tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
		NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			go func() {
				defer conn.Close()
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				for got := 0; got < 100; {
					n, err := conn.Read(buf)
					if err != nil {
						return
					}
					got += n
				}
			}()
		}
	}()
}
