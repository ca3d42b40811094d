package e2e

import (
	"bufio"
	"context"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
)

// Claim (issue 17, the Envoy side): Envoy spreads requests over several
// duet replicas and skips a dead one. Three replicas (sharing nothing), 40
// requests/s through the real Envoy; replica 1 is killed with SIGKILL
// mid-run, then restarted:
//   - at least 99 % of the requests are served, every other one is a clear
//     error (an OpenAI error) that came within a second, none is lost;
//   - Envoy marks the dead replica unhealthy on both clusters to duet within
//     a second, and sends it no stream from then until it is back;
//   - the access-log streams move to the live replicas: their feedback
//     keeps arriving, an entry for every leg of every request routed after
//     the kill was noticed;
//   - the restarted replica is healthy again and routes requests.
func TestReplicasSurviveSIGKILL(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:      []harness.SimSpec{{DPSize: 2}},
		Decode:       []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		DuetReplicas: 3,
		LogLevel:     "info",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	traffic := startPaced(ctx, s, 40)

	time.Sleep(2 * time.Second)
	for i := range s.Duets {
		if n := s.ReplicaMetric(i, "duet_extproc_requests_total", nil); n == 0 {
			t.Errorf("replica %d routed no request before the kill: Envoy does not spread over the replicas", i)
		}
	}
	// The victim holds an access-log stream, so that the kill moves it.
	victim := -1
	for i := range s.Duets {
		if s.ReplicaMetric(i, "duet_feedback_streams", nil) > 0 {
			victim = i
			break
		}
	}
	if victim < 0 {
		t.Fatal("no replica holds an access-log stream")
	}
	victimFeedback := s.ReplicaMetric(victim, "duet_feedback_entries_total", nil)
	killed := time.Now()
	s.Duets[victim].Kill()
	gone := s.DuetGRPCs[victim]
	// Skipped at once (the first refused stream ejects it); failing its
	// health checks soon after, traffic or not.
	for _, cluster := range []string{envoy.ClusterDuet, envoy.ClusterFeedback} {
		d := waitHost(t, s, cluster, gone, "unhealthy", unhealthy, killed)
		t.Logf("%s: replica %d skipped %v after SIGKILL", cluster, victim, d.Round(time.Millisecond))
		if d > time.Second {
			t.Errorf("%s: the dead replica was skipped after %v, want within 1s", cluster, d)
		}
	}
	noticed := time.Now()
	streamsAtNotice := hostRequests(t, s, gone)
	feedbackAtNotice := liveFeedback(t, s, victim)
	for _, cluster := range []string{envoy.ClusterDuet, envoy.ClusterFeedback} {
		d := waitHost(t, s, cluster, gone, "failing its health checks", failingChecks, killed)
		t.Logf("%s: replica %d failing its health checks %v after SIGKILL", cluster, victim, d.Round(time.Millisecond))
		if d > time.Second {
			t.Errorf("%s: the dead replica failed its health checks after %v, want within 1s", cluster, d)
		}
	}

	time.Sleep(2 * time.Second)
	if n := hostRequests(t, s, gone); n != streamsAtNotice {
		t.Errorf("Envoy sent the dead replica %d streams after it was marked unhealthy", n-streamsAtNotice)
	}
	restarted := time.Now()
	if err := s.RestartReplica(ctx, victim); err != nil {
		t.Fatalf("restart replica %d: %v", victim, err)
	}
	d := waitHost(t, s, envoy.ClusterDuet, gone, "healthy", harness.HostHealth.Healthy, restarted)
	t.Logf("%s: replica %d healthy again %v after its restart began", envoy.ClusterDuet, victim, d.Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	results := traffic.stop()

	checkReplicaOutcomes(t, results, killed)
	if n := s.ReplicaMetric(victim, "duet_extproc_requests_total", nil); n == 0 {
		t.Errorf("the restarted replica routed no request in 2s")
	}
	var servedAfter int
	for _, r := range results {
		if r.start.After(noticed) && r.Outcome == harness.OutcomeServed {
			servedAfter++
		}
	}
	// Each served PD request has three entries: the request, its decode leg
	// and its prefill mirror. The live replicas get them all.
	harness.WaitFor(t, 10*time.Second, "the feedback of every request routed after the kill on the live replicas", func() bool {
		return liveFeedback(t, s, victim)-feedbackAtNotice >= float64(3*servedAfter)
	})
	live := liveFeedback(t, s, victim)
	t.Logf("live replicas: %v feedback entries since the kill was noticed, for %d requests served since", live-feedbackAtNotice, servedAfter)
	written, err := harness.EnvoyCounters(ctx, s.EnvoyAdminURL, `^access_logs\.grpc_access_log\.logs_written$`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("access-log entries: %d written by Envoy, %v received (%v by the killed replica before the kill): %v lost with it",
		written["access_logs.grpc_access_log.logs_written"], victimFeedback+live, victimFeedback,
		float64(written["access_logs.grpc_access_log.logs_written"])-victimFeedback-live)
	logEnvoyStats(t, s, `cluster\.duet_(extproc|feedback)\.(upstream_rq_retry|upstream_cx_connect_fail|upstream_rq_total|health_check\.(failure|network_failure)|outlier_detection\.ejections_enforced_total)|grpc_access_log`)
}

// logEnvoyStats logs Envoy's counters whose names match filter.
func logEnvoyStats(t *testing.T, s *harness.Stack, filter string) {
	t.Helper()
	counts, err := harness.EnvoyCounters(context.Background(), s.EnvoyAdminURL, filter)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		t.Logf("envoy %s = %d", k, counts[k])
	}
}

// pacedResult is one request of a paced run: when it started, and how it
// ended.
type pacedResult struct {
	harness.Result
	start time.Time
}

// paced sends chat requests through a stack at a fixed rate, each in its
// own goroutine, alternating streamed and not, until stopped.
type paced struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []pacedResult
}

// startPaced starts sending rate requests per second through s.
func startPaced(ctx context.Context, s *harness.Stack, rate int) *paced {
	ctx, cancel := context.WithCancel(ctx)
	p := &paced{cancel: cancel}
	p.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p.wg.Go(func() {
				start := time.Now()
				r := do(context.Background(), s, i, i%2 == 1)
				p.mu.Lock()
				p.results = append(p.results, pacedResult{Result: r, start: start})
				p.mu.Unlock()
			})
		}
	})
	return p
}

// stop stops sending, waits for every request and returns them all.
func (p *paced) stop() []pacedResult {
	p.cancel()
	p.wg.Wait()
	return p.results
}

// checkReplicaOutcomes holds a run with a killed replica to the issue's
// bar: at least 99 % served, every other request a clear error (an OpenAI
// error envelope) within a second, none lost.
func checkReplicaOutcomes(t *testing.T, results []pacedResult, killed time.Time) {
	t.Helper()
	var served int
	var worst time.Duration
	for _, r := range results {
		worst = max(worst, r.Wait)
		if r.Outcome == harness.OutcomeServed {
			served++
			continue
		}
		t.Logf("request %s, %v after the kill: %s (status %d) after %v: %.300s", r.ID, r.start.Sub(killed).Round(time.Millisecond),
			r.Outcome, r.Status, r.Wait.Round(time.Millisecond), r.Detail)
		if r.Outcome != harness.OutcomeError {
			t.Errorf("request %s: %s, want served or a clear error", r.ID, r.Outcome)
			continue
		}
		if e, err := parseOpenAIError([]byte(r.Detail)); err != nil || e.Message == "" {
			t.Errorf("request %s: error body is not an OpenAI error: %s", r.ID, r.Detail)
		}
		if r.Wait > time.Second {
			t.Errorf("request %s: the error came after %v, want within 1s", r.ID, r.Wait)
		}
	}
	t.Logf("%d requests, %d served (%.2f %%), slowest %v", len(results), served, 100*float64(served)/float64(len(results)),
		worst.Round(time.Millisecond))
	if len(results) == 0 || float64(served) < 0.99*float64(len(results)) {
		t.Errorf("%d of %d requests served, want at least 99 %%", served, len(results))
	}
}

// Host states for waitHost.
func unhealthy(h harness.HostHealth) bool     { return !h.Healthy() }
func failingChecks(h harness.HostHealth) bool { return h.FailedActiveHealthCheck }

// waitHost waits until the host at addr in Envoy's cluster is in the
// state that cond reports (named what), and returns how long after since
// that was.
func waitHost(t *testing.T, s *harness.Stack, cluster, addr, what string, cond func(harness.HostHealth) bool, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		hosts, err := harness.EnvoyHosts(context.Background(), s.EnvoyAdminURL, cluster)
		if err != nil {
			t.Fatal(err)
		}
		h, ok := hosts[addr]
		if !ok {
			t.Fatalf("%s has no host %s: %v", cluster, addr, hosts)
		}
		if cond(h) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: host %s not %s after 10s: %+v", cluster, addr, what, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hostRequests is how many streams Envoy sent duet's replica at addr on
// the ext_proc cluster.
func hostRequests(t *testing.T, s *harness.Stack, addr string) int64 {
	t.Helper()
	hosts, err := harness.EnvoyHosts(context.Background(), s.EnvoyAdminURL, envoy.ClusterDuet)
	if err != nil {
		t.Fatal(err)
	}
	return hosts[addr].Requests
}

// liveFeedback sums the access-log entries received by every replica but
// the one numbered dead.
func liveFeedback(t *testing.T, s *harness.Stack, dead int) float64 {
	t.Helper()
	sum := 0.0
	for i := range s.Duets {
		if i != dead {
			sum += s.ReplicaMetric(i, "duet_feedback_entries_total", nil)
		}
	}
	return sum
}

// Claim (issue 17): a request whose ext_proc stream is open on a replica
// when that replica dies, after duet answered its headers (the body still
// uploading), is not retried (Envoy has the answer's start) and ends at
// once in Envoy's 503, in the OpenAI error envelope; the next request goes
// to a live replica and is served.
func TestInFlightStreamOnKilledReplica(t *testing.T) {
	s := startStack(t, harness.Options{Decode: []harness.SimSpec{{}}, DuetReplicas: 3, LogLevel: "info"})
	body := chatBody(false, "")
	conn := stallUpload(t, s, body)
	holder := -1
	harness.WaitFor(t, 10*time.Second, "the stalled upload's stream on a replica", func() bool {
		hosts, err := harness.EnvoyHosts(context.Background(), s.EnvoyAdminURL, envoy.ClusterDuet)
		if err != nil {
			t.Fatal(err)
		}
		for i, addr := range s.DuetGRPCs {
			if hosts[addr].Active == 1 {
				holder = i
			}
		}
		return holder >= 0
	})
	// The stream being open is not enough: killed before it answered the
	// headers, the replica's stream is retried on another one (issue 17's
	// other claim), which then waits for the stalled body.
	harness.WaitFor(t, 10*time.Second, "duet's answer to the stalled upload's headers", func() bool {
		counts, err := harness.EnvoyCounters(context.Background(), s.EnvoyAdminURL, `ext_proc\..*stream_msgs_received$`)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, c := range counts {
			n += c
		}
		return n >= 1
	})
	killed := time.Now()
	s.Duets[holder].Kill()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the in-flight request got no answer: %v", err)
	}
	took := time.Since(killed)
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("in flight on replica %d: status %d %v after SIGKILL: %s", holder, resp.StatusCode, took.Round(time.Millisecond), out)
	checkOpenAIError(t, resp, out, http.StatusServiceUnavailable, "server_error")
	if took > time.Second {
		t.Errorf("the answer came %v after the kill, want within 1s", took)
	}
	for i := range 6 {
		if r := do(context.Background(), s, i, i%2 == 1); r.Outcome != harness.OutcomeServed {
			t.Errorf("request %d after the kill: %s (status %d): %s", i, r.Outcome, r.Status, r.Detail)
		}
	}
}
