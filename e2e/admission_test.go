package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
)

// admissionYAML is the admission section of the admission tests: batch
// requests may wait 3 s, interactive ones 20 s. Clients cannot choose
// their class with a header (Envoy strips every x-duet-* header a client
// sends): the interactive class is the API key sk-interactive's, by the
// SHA-256 of the key, and the tenant is the key's hash. A prefill rank
// with 3,000 prompt tokens pending is saturated (the engines' own queue is
// not looked at, so only duet's view counts).
const admissionYAML = `admission:
  classes:
  - {name: interactive, priority: 10, wait_limit: 20s}
  - {name: batch, priority: 0, wait_limit: 3s}
  class_header: x-duet-priority
  api_keys: {7645b28b5463faac017baeb9c4aac66f80fda3eca4247f3f7838053082d5f6df: interactive}
  tenant_from_api_key: true
  max_queued: 100
  saturation: {prefill_tokens: 3000, kv_fraction: -1, waiting: -1}
`

// admissionStack is one prefill and one decode engine whose prefill is
// slow (a 2,000-token prompt takes about half a second), behind duet with
// admissionYAML; with replicas > 1, that many duet replicas share their
// state over NATS.
func admissionStack(t *testing.T, replicas int) *harness.Stack {
	slow := []string{"--prefill-ms-per-1k-tokens", "250"}
	opts := harness.Options{
		Prefill:  []harness.SimSpec{{Args: slow}},
		Decode:   []harness.SimSpec{{}},
		DuetYAML: admissionYAML, LogLevel: "info", MaxRoutingRequests: 256,
		DuetDefaultPolicies: true,
	}
	if replicas > 1 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		nats, err := harness.StartNATS(ctx, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nats.Stop(time.Second) })
		opts.DuetReplicas = replicas
		opts.DuetYAML += fmt.Sprintf("sync:\n  nats:\n    url: %s\n  heartbeat: 200ms\n", nats.URL)
	}
	s := startStack(t, opts)
	for i := range replicas {
		if replicas > 1 {
			harness.WaitFor(t, 10*time.Second, fmt.Sprintf("replica %d to hear its peers", i), func() bool {
				return s.ReplicaMetric(i, "duet_sync_peers", nil) == float64(replicas-1)
			})
		}
	}
	return s
}

// replicaSum sums a metric over every replica of s.
func replicaSum(s *harness.Stack, name string, match map[string]string) float64 {
	sum := 0.0
	for i := range s.DuetAdminURLs {
		sum += s.ReplicaMetric(i, name, match)
	}
	return sum
}

// classResult is one request's outcome.
type classResult struct {
	class  string
	status int
	took   time.Duration
	retry  string // Retry-After
	body   string
	err    error
}

// sendClass sends one chat request of class with a prompt of about
// promptTokens tokens (4 characters each), with the API key sk-<class>
// and, to show that a client cannot pick its class, the header naming
// class interactive.
func sendClass(ctx context.Context, s *harness.Stack, class string, i, promptTokens int) classResult {
	content := fmt.Sprintf("request %d of %s: %s", i, class, strings.Repeat("abcd", promptTokens))
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":4}`, content)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.EnvoyURL+"/v1/chat/completions", bytes.NewReader([]byte(body)))
	if err != nil {
		return classResult{class: class, err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-"+class)
	req.Header.Set("x-duet-priority", "interactive")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return classResult{class: class, err: err, took: time.Since(start)}
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return classResult{class: class, status: resp.StatusCode, took: time.Since(start), retry: resp.Header.Get("Retry-After"), body: string(out), err: err}
}

// Claim (issue 27): while a flood of low-priority long prompts saturates
// the prefill engine, high-priority short requests are still served, ahead
// of the flood; every request is served or gets 429 with Retry-After
// within its class's wait limit, and none is lost. With three replicas
// sharing their picks over NATS, each queues its own streams and sees the
// others' reservations: the same holds, and every replica's queue and
// reservations end at 0.
func TestAdmissionPriorityUnderFlood(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) { testPriorityUnderFlood(t, replicas) })
	}
}

func testPriorityUnderFlood(t *testing.T, replicas int) {
	s := admissionStack(t, replicas)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mu sync.Mutex
	var results []classResult
	var wg sync.WaitGroup
	send := func(class string, i, tokens int) {
		wg.Go(func() {
			r := sendClass(ctx, s, class, i, tokens)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	const flood, interactive = 60, 6
	for i := range flood {
		send("batch", i, 2000)
	}
	harness.WaitFor(t, 20*time.Second, "the flood to queue in duet", func() bool {
		return replicaSum(s, "duet_admission_queued", map[string]string{"class": "batch"}) > 5
	})
	for i := range interactive {
		send("interactive", i, 50)
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()

	var batchServed []time.Duration
	var served, refused int
	var interactiveTook []time.Duration
	for _, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("%s request lost: %v after %v", r.class, r.err, r.took)
		case r.status == http.StatusOK && r.class == "interactive":
			interactiveTook = append(interactiveTook, r.took)
			served++
		case r.status == http.StatusOK:
			batchServed = append(batchServed, r.took)
			served++
		case r.status == http.StatusTooManyRequests:
			refused++
			if r.class == "interactive" {
				t.Errorf("an interactive request was refused: %s", r.body)
			}
			if r.retry == "" || gjson.Get(r.body, "error.code").String() != "rate_limit_exceeded" {
				t.Errorf("429 without Retry-After or OpenAI error: %q %s", r.retry, r.body)
			}
			// 3 s wait limit, plus the time to reach duet.
			if r.took > 6*time.Second {
				t.Errorf("a batch request was refused after %v, past its 3s wait limit", r.took)
			}
		default:
			t.Errorf("%s request: status %d: %s", r.class, r.status, r.body)
		}
	}
	if len(results) != flood+interactive {
		t.Fatalf("%d results for %d requests", len(results), flood+interactive)
	}
	if len(interactiveTook) != interactive {
		t.Fatalf("%d of %d interactive requests served", len(interactiveTook), interactive)
	}
	if refused == 0 {
		t.Errorf("no batch request was refused: the flood did not overload the engines")
	}
	slices.Sort(batchServed)
	slices.Sort(interactiveTook)
	t.Logf("served %d (batch %d), refused %d; interactive took %v; batch served took p50 %v", served, len(batchServed), refused,
		interactiveTook, median(batchServed))
	if len(batchServed) > 0 && interactiveTook[len(interactiveTook)-1] >= median(batchServed) {
		t.Errorf("the slowest interactive request took %v, not less than the batch median %v: priority did not hold",
			interactiveTook[len(interactiveTook)-1], median(batchServed))
	}
	harness.WaitFor(t, 10*time.Second, "every queue to empty", func() bool {
		return replicaSum(s, "duet_admission_queued", nil) == 0
	})
	if n := replicaSum(s, "duet_admission_requests_total", map[string]string{"class": "interactive", "outcome": "queued_admitted"}) +
		replicaSum(s, "duet_admission_requests_total", map[string]string{"class": "interactive", "outcome": "admitted"}); n != interactive {
		t.Errorf("duet counted %v interactive requests admitted, want %d", n, interactive)
	}
	harness.WaitFor(t, 15*time.Second, "every replica's reservations to end", func() bool {
		return replicaSum(s, "duet_target_tokens", map[string]string{"kind": "reserved"}) == 0
	})
}

// Claim (issue 27): a queued request whose client goes away leaves duet's
// queue at once, and is counted as such.
func TestAdmissionClientLeaves(t *testing.T) {
	s := admissionStack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	// Saturate the prefill engine with requests that stay.
	saturatePrefill(ctx, t, s, &wg, 8)
	leaving, leave := context.WithCancel(ctx)
	const goners = 5
	for i := range goners {
		wg.Go(func() { sendClass(leaving, s, "batch", 100+i, 100) })
	}
	harness.WaitFor(t, 20*time.Second, "the leaving requests to queue", func() bool {
		return s.ReplicaMetric(0, "duet_admission_queued", map[string]string{"class": "batch"}) == goners
	})
	leave()
	harness.WaitFor(t, 5*time.Second, "the leaving requests to leave the queue", func() bool {
		return s.ReplicaMetric(0, "duet_admission_queued", map[string]string{"class": "batch"}) == 0
	})
	if n := s.ReplicaMetric(0, "duet_admission_requests_total", map[string]string{"class": "batch", "outcome": "left"}); n != goners {
		t.Errorf("duet counted %v requests that left, want %d", n, goners)
	}
	wg.Wait()
}

// saturatePrefill sends n interactive requests of 2,000 prompt tokens
// (half a second of prefill each on admissionStack's engine) on wg, and
// waits until duet sees the prefill engine saturated.
func saturatePrefill(ctx context.Context, t *testing.T, s *harness.Stack, wg *sync.WaitGroup, n int) {
	t.Helper()
	for i := range n {
		wg.Go(func() { sendClass(ctx, s, "interactive", i, 2000) })
	}
	harness.WaitFor(t, 20*time.Second, "the prefill engine to saturate", func() bool {
		return s.ReplicaMetric(0, "duet_saturated_targets", map[string]string{"role": "prefill"}) == 1 ||
			s.ReplicaMetric(0, "duet_admission_queued", nil) > 0
	})
}

// median of sorted durations.
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)/2]
}

// Claim (issue 27): where every engine of the pool runs SGLang's priority
// scheduling (advertised in /server_info), both legs carry the class's
// priority, whatever priority the client sent; where the engines do not,
// the client's priority is dropped, so engines that abort prioritized
// requests when priority scheduling is off serve them.
func TestAdmissionEnginePriority(t *testing.T) {
	tests := []struct {
		name    string
		engine  []string
		want    map[string]*int64 // by class
		wantAll int               // requests each engine serves
	}{
		{"priority scheduling", []string{"--enable-priority-scheduling"}, map[string]*int64{"interactive": ptr(int64(10)), "batch": ptr(int64(0))}, 2},
		{"aborts when off", []string{"--abort-on-priority-when-disabled"}, map[string]*int64{"interactive": nil, "batch": nil}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startStack(t, harness.Options{
				Prefill: []harness.SimSpec{{Args: tt.engine}}, Decode: []harness.SimSpec{{Args: tt.engine}},
				DuetYAML: admissionYAML, DuetDefaultPolicies: true,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i, class := range []string{"interactive", "batch"} {
				content := fmt.Sprintf("priority %d", i)
				body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"max_tokens":2,"priority":99}`, content)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.EnvoyURL+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer sk-"+class)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d: %s", class, resp.StatusCode, out)
				}
			}
			for _, e := range []*harness.Sim{s.Prefill[0], s.Decode[0]} {
				recs, err := e.Requests(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) != tt.wantAll {
					t.Fatalf("%s recorded %d requests, want %d", e.Name, len(recs), tt.wantAll)
				}
				// Sent one after the other: interactive, then batch.
				slices.SortFunc(recs, func(a, b harness.Record) int { return a.StartedAt.Compare(b.StartedAt) })
				for i, r := range recs {
					class := []string{"interactive", "batch"}[i]
					if fmt.Sprint(deref(r.Priority)) != fmt.Sprint(deref(tt.want[class])) {
						t.Errorf("%s: the %s request carried priority %v, want %v", e.Name, class, deref(r.Priority), deref(tt.want[class]))
					}
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// deref shows a priority: its value, or "none".
func deref(p *int64) any {
	if p == nil {
		return "none"
	}
	return *p
}
