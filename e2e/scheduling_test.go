package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/duet-router/duet/e2e/harness"
)

// busy occupies one rank of an engine directly (not through Envoy) with a
// long request, pinned by routed_dp_rank, until ctx ends.
func busy(ctx context.Context, t *testing.T, sim *harness.Sim, rank int) {
	t.Helper()
	body := fmt.Sprintf(`{"text":%q,"routed_dp_rank":%d,"sampling_params":{"max_new_tokens":100000}}`,
		strings.Repeat("load ", 8000), rank)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sim.URL+"/generate", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
}

// waitForLoad waits until the engine reports rank as loaded.
func waitForLoad(t *testing.T, sim *harness.Sim, rank int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	needle := []byte(fmt.Sprintf(`"dp_rank":%d,`, rank))
	for time.Now().Before(deadline) {
		resp, err := http.Get(sim.URL + "/v1/loads?include=core")
		if err == nil {
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if i := bytes.Index(buf.Bytes(), needle); i >= 0 && bytes.Contains(buf.Bytes()[i:min(i+200, buf.Len())], []byte(`"num_running_reqs":1`)) {
				time.Sleep(600 * time.Millisecond) // let duet scrape it (interval 200ms)
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s rank %d never reported the load", sim.Name, rank)
}

// servedBy returns "address/dpN" from the simulator's response headers.
func servedBy(resp *http.Response) string {
	return resp.Header.Get("X-Sim-Server") + "/dp" + resp.Header.Get("X-Sim-DP-Rank")
}

// With least_tokens, new requests avoid the rank an engine reports as
// loaded; before the load they are spread over every rank.
func TestLeastTokensAvoidsLoadedRank(t *testing.T) {
	s := startStack(t, harness.Options{
		Decode:       []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		DecodePolicy: "least_tokens",
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loaded := s.Decode[0].Address + "/dp1"
	busy(ctx, t, s.Decode[0], 1)
	waitForLoad(t, s.Decode[0], 1)

	served := map[string]int{}
	for i := range 12 {
		resp, body := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": requestID(t, i)},
			chatBody(false, ""))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		served[servedBy(resp)]++
	}
	if served[loaded] != 0 {
		t.Errorf("%d of 12 requests went to the loaded rank %s: %v", served[loaded], loaded, served)
	}
	if len(served) < 2 {
		t.Logf("served by %v", served)
	}
}

// With cache_aware, a growing conversation stays on the (engine, rank) that
// caches its prefix until that target's load exceeds the imbalance bound;
// then it moves.
func TestConversationSticksUntilImbalance(t *testing.T) {
	s := startStack(t, harness.Options{
		Decode:       []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		DecodePolicy: "{name: cache_aware, cache_threshold: 0.3, balance_abs_tokens: 4000, balance_rel: 1.5}",
	})
	system := strings.Repeat("You are a helpful assistant that answers briefly. ", 20)
	messages := fmt.Sprintf(`{"role":"system","content":%q}`, system)
	turn := func(i int) string {
		messages += fmt.Sprintf(`,{"role":"user","content":"question %d: tell me more about topic %d"}`, i, i)
		body := fmt.Sprintf(`{"model":"sim-model","messages":[%s],"max_tokens":8}`, messages)
		resp, out := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": requestID(t, i)}, []byte(body))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", i, resp.StatusCode, out)
		}
		messages += `,{"role":"assistant","content":"a short answer"}`
		return servedBy(resp)
	}
	home := turn(0)
	for i := 1; i < 6; i++ {
		if got := turn(i); got != home {
			t.Fatalf("turn %d left the cached target %s for %s", i, home, got)
		}
	}
	// Load the conversation's home rank well past the imbalance bound.
	var homeSim *harness.Sim
	for _, sim := range s.Decode {
		if strings.HasPrefix(home, sim.Address+"/") {
			homeSim = sim
		}
	}
	var rank int
	fmt.Sscanf(home[strings.LastIndex(home, "/dp")+3:], "%d", &rank)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy(ctx, t, homeSim, rank)
	waitForLoad(t, homeSim, rank)
	if got := turn(6); got == home {
		t.Errorf("turn 6 stayed on %s although its load exceeds the imbalance bound", home)
	}
}

// duetMetrics scrapes and parses duet's /metrics.
func duetMetrics(t *testing.T, s *harness.Stack) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	mfs, err := s.DuetMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// labelsOf returns a sample's labels as a map.
func labelsOf(m *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// duetMetricSum sums the samples of one metric family on duet's /metrics
// whose labels include match.
func duetMetricSum(t *testing.T, s *harness.Stack, name string, match map[string]string) float64 {
	t.Helper()
	return harness.SumMetric(duetMetrics(t, s), name, match)
}

// With scraping off, only completion feedback can end reservations: after
// the requests finish, Envoy's access-log entries release every token.
func TestFeedbackReleasesReservations(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:       []harness.SimSpec{{DPSize: 2}},
		Decode:        []harness.SimSpec{{DPSize: 2}},
		PrefillPolicy: "least_tokens",
		DecodePolicy:  "least_tokens",
		LoadInterval:  -time.Second,
	})
	for i := range 4 {
		resp, body := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": requestID(t, i)}, chatBody(i%2 == 0, ""))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		reserved := duetMetricSum(t, s, "duet_target_tokens", map[string]string{"kind": "reserved"})
		released := duetMetricSum(t, s, "duet_feedback_total", map[string]string{"outcome": "released"})
		if reserved == 0 && released >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %v tokens still reserved, %v releases", reserved, released)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := duetMetricSum(t, s, "duet_load_scrape_errors_total", nil); n != 0 {
		t.Errorf("scraping was disabled but %v scrapes failed", n)
	}
	// Every entry (the request's, each leg's) finds its request: a leg's
	// entry that comes after the request's is already_released, never
	// unknown_request, which a healthy stack does not report.
	for {
		counts := map[string]float64{}
		for _, o := range []string{"released", "already_released", "unknown_request"} {
			counts[o] = duetMetricSum(t, s, "duet_feedback_total", map[string]string{"outcome": o})
		}
		if counts["unknown_request"] != 0 {
			t.Fatalf("feedback outcomes %v: a healthy stack reported unknown_request", counts)
		}
		if counts["released"]+counts["already_released"] >= 12 {
			t.Logf("feedback outcomes %v", counts)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: feedback outcomes %v, want 12 entries (3 per request)", counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
