package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// limitsYAML is admissionYAML with a batch class that may wait 20 s, as
// long as the interactive class.
var limitsYAML = strings.Replace(admissionYAML, "{name: batch, priority: 0, wait_limit: 3s}", "{name: batch, priority: 0, wait_limit: 20s}", 1)

// staleBootstrap makes Envoy's bootstrap as `duet envoy-config` rendered
// it from duet's configuration before its wait limits were raised: opts
// with renderedYAML in place of DuetYAML. keepMetadata false strips the
// ext_proc timeouts from the stream's metadata, as in a bootstrap duet did
// not render (Envoy Gateway's, Istio's, one written by hand).
func staleBootstrap(t *testing.T, opts harness.Options, renderedYAML string, keepMetadata bool) func(context.Context, harness.Addresses) ([]byte, error) {
	return func(ctx context.Context, addrs harness.Addresses) ([]byte, error) {
		tools, err := harness.FindTools()
		if err != nil {
			return nil, err
		}
		old := opts
		old.DuetYAML = renderedYAML
		path := filepath.Join(t.TempDir(), "duet-before.yaml")
		if err := os.WriteFile(path, []byte(harness.DuetConfig(old, addrs)), 0o600); err != nil {
			return nil, err
		}
		out, err := exec.CommandContext(ctx, tools.Duet, "envoy-config", "-config", path).Output()
		if err != nil || keepMetadata {
			return out, err
		}
		var kept []string
		lines := strings.Split(string(out), "\n")
		for i, l := range lines {
			if strings.Contains(l, "x-duet-envoy-") {
				continue
			}
			if strings.TrimSpace(l) == "initial_metadata:" && i+1 < len(lines) && strings.Contains(lines[i+1], "x-duet-envoy-") &&
				(i+3 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+3]), "- {key: authorization")) {
				continue
			}
			kept = append(kept, l)
		}
		return []byte(strings.Join(kept, "\n")), nil
	}
}

// Claim (issue 37, item 1): duet runs classes that may wait 20 s, while
// Envoy still runs a bootstrap rendered when interactive requests waited
// 2 s and batch ones 1 s (max_message_timeout 4 s).
//
//   - Rendered by this duet, the bootstrap tells duet its timeouts: queued
//     batch requests get duet's 429 with Retry-After within Envoy's 4 s,
//     never Envoy's 504, and duet warns once per class that the bootstrap
//     cuts it short, naming the fix.
//   - A bootstrap that does not tell them (one duet did not render):
//     Envoy ignores the 21 s override and answers 504 at its 2 s
//     message_timeout; duet counts those requests as proxy_timeout, not as
//     clients that left, and warns with the fix.
func TestAdmissionWithinEnvoyLimits(t *testing.T) {
	rendered := strings.NewReplacer(
		"{name: interactive, priority: 10, wait_limit: 20s}", "{name: interactive, priority: 10, wait_limit: 2s}",
		"{name: batch, priority: 0, wait_limit: 3s}", "{name: batch, priority: 0, wait_limit: 1s}",
	).Replace(admissionYAML)
	for _, tt := range []struct {
		name         string
		keepMetadata bool
	}{
		{"a bootstrap duet rendered", true},
		{"a bootstrap that does not say its timeouts", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts := harness.Options{
				Prefill:  []harness.SimSpec{{Args: []string{"--prefill-ms-per-1k-tokens", "250"}}},
				Decode:   []harness.SimSpec{{}},
				DuetYAML: limitsYAML, LogLevel: "info", MaxRoutingRequests: 256,
				DuetDefaultPolicies: true,
			}
			opts.Bootstrap = staleBootstrap(t, opts, rendered, tt.keepMetadata)
			s := startStack(t, opts)
			config, err := os.ReadFile(s.EnvoyConfig)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(config), "max_message_timeout: 4s") {
				t.Fatalf("the stale bootstrap's max_message_timeout is not 4s:\n%s", config)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			// Saturate the prefill engine for several seconds (about 8 s
			// of prefill in all).
			saturatePrefill(ctx, t, s, &wg, 16)
			const batch = 6
			results := make([]classResult, batch)
			var bwg sync.WaitGroup
			for i := range batch {
				bwg.Go(func() { results[i] = sendClass(ctx, s, "batch", 100+i, 100) })
			}
			bwg.Wait()
			wg.Wait()
			var refused, timedOut int
			for i, r := range results {
				switch {
				case r.err != nil:
					t.Errorf("batch %d: %v", i, r.err)
				case r.status == http.StatusTooManyRequests:
					refused++
					if r.retry == "" {
						t.Errorf("batch %d: 429 without Retry-After", i)
					}
				case r.status == http.StatusGatewayTimeout:
					timedOut++
				case r.status != http.StatusOK:
					t.Errorf("batch %d: %d %s", i, r.status, r.body)
				}
				if r.took > 5*time.Second {
					t.Errorf("batch %d answered after %v, past Envoy's 4 s", i, r.took)
				}
			}
			log, err := os.ReadFile(s.Duet.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			counted := s.ReplicaMetric(0, "duet_admission_requests_total", map[string]string{"class": "batch", "outcome": "proxy_timeout"})
			left := s.ReplicaMetric(0, "duet_admission_requests_total", map[string]string{"class": "batch", "outcome": "left"})
			t.Logf("batch: %d refused (429), %d timed out (504), proxy_timeout %v, left %v", refused, timedOut, counted, left)
			if tt.keepMetadata {
				if timedOut != 0 || counted != 0 {
					t.Errorf("%d batch requests got Envoy's 504 (%v counted): duet held them past Envoy's limit", timedOut, counted)
				}
				if refused == 0 {
					t.Errorf("no batch request was queued and refused: the test did not saturate the engines")
				}
				if n := warnings(t, string(log), "cuts this class's wait limit short", `"class":"batch"`); n != 1 {
					t.Errorf("duet warned %d times that the bootstrap cuts the batch class short, want once", n)
				}
				return
			}
			if timedOut == 0 {
				t.Fatalf("no batch request got Envoy's 504: the test did not reproduce the stale bootstrap")
			}
			// duet hears of Envoy's reset a little after the client got
			// its 504. A request the queue let through at the moment Envoy
			// gave up is routed (queued_admitted): duet learns of the 504
			// only from the access log.
			batchOutcome := func(o string) float64 {
				return s.ReplicaMetric(0, "duet_admission_requests_total", map[string]string{"class": "batch", "outcome": o})
			}
			var late float64
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if counted, late = batchOutcome("proxy_timeout"), batchOutcome("queued_admitted"); counted+late >= float64(timedOut) {
					break
				}
			}
			left = batchOutcome("left")
			t.Logf("batch outcomes: proxy_timeout %v, queued_admitted %v, left %v, wait_limit %v, admitted %v", counted, late, left,
				batchOutcome("wait_limit"), batchOutcome("admitted"))
			if counted < float64(timedOut)-late || counted == 0 || left != 0 {
				t.Errorf("duet counted %v proxy_timeout and %v left, want %d (less %v let through as Envoy gave up) and 0", counted, left, timedOut, late)
			}
			if log, err = os.ReadFile(s.Duet.LogPath); err != nil {
				t.Fatal(err)
			}
			if warnings(t, string(log), "Envoy stopped waiting for a queued request", `"class":"batch"`) == 0 {
				t.Errorf("duet did not warn of Envoy's timeout")
			}
		})
	}
}

// warnings counts the lines of log that hold every one of parts, and
// logs the first.
func warnings(t *testing.T, log string, parts ...string) int {
	t.Helper()
	n := 0
	for l := range strings.Lines(log) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			if n == 0 {
				t.Logf("duet logged: %s", strings.TrimSpace(l))
			}
			n++
		}
	}
	return n
}
