package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// pd is the shared PD stack: two prefill engines (dp 2 and dp 4) and two
// decode engines (dp 2 each), so every choice duet makes is visible.
var pd *harness.Stack

var fastPrefill = []string{"--prefill-ms-per-1k-tokens", "1"}

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	pd, err = harness.Start(ctx, harness.Options{
		// Fast prefill so that the multi-MiB body test stays within the KV timeout.
		Prefill: []harness.SimSpec{{DPSize: 2, Args: fastPrefill}, {DPSize: 4, Args: fastPrefill}},
		Decode:  []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start the PD stack:", err)
		os.Exit(1)
	}
	if v, err := pd.Tools.EnvoyVersion(); err == nil {
		fmt.Println("e2e: Envoy", v, "logs in", pd.Dir)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, pd.Logs())
	}
	pd.Close()
	os.Exit(code)
}

// startStack starts a dedicated stack for one test.
func startStack(t *testing.T, opts harness.Options) *harness.Stack {
	t.Helper()
	s, err := harness.Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() { s.CloseLoggingIfFailed(t) })
	return s
}

// requestTimeout bounds each request a test sends.
const requestTimeout = 30 * time.Second

var httpClient = &http.Client{Timeout: requestTimeout}

// send sends body (none when nil) to the stack's Envoy and returns the
// response and its body (see harness.Stack.Send).
func send(t *testing.T, s *harness.Stack, method, path string, hdr map[string]string, body []byte) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	resp, data, err := s.Send(ctx, method, path, hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// requestID returns a unique x-request-id for a test request.
func requestID(t *testing.T, i int) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), i, time.Now().UnixNano())
}

// legs finds the records of one request on the given engines. It waits until
// want records exist (the mirror may finish after the client's response).
func legs(t *testing.T, sims []*harness.Sim, id string, want int) map[*harness.Sim][]harness.Record {
	t.Helper()
	found, err := harness.WaitRecords(context.Background(), sims, id, want, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// only returns the single (sim, record) in found.
func only(t *testing.T, found map[*harness.Sim][]harness.Record) (*harness.Sim, harness.Record) {
	t.Helper()
	sim, rec, err := harness.OnlyRecord(found)
	if err != nil {
		t.Fatal(err)
	}
	return sim, rec
}

// stat reads one counter from Envoy's admin /stats.
func stat(t *testing.T, s *harness.Stack, name string) int {
	t.Helper()
	counts, err := harness.EnvoyCounters(context.Background(), s.EnvoyAdminURL, "^"+strings.ReplaceAll(name, ".", `\.`)+"$")
	if err != nil {
		t.Fatal(err)
	}
	return int(counts[name])
}

// upstreamRequests is the total upstream requests Envoy sent to the engine clusters.
func upstreamRequests(t *testing.T, s *harness.Stack) (prefill, decode int) {
	return stat(t, s, "cluster.duet_prefill.upstream_rq_total"), stat(t, s, "cluster.duet_decode.upstream_rq_total")
}

// chatBody is a small chat request.
func chatBody(stream bool, extra string) []byte {
	return []byte(fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"Tell me about disaggregated serving."}],"max_tokens":8,"stream":%v%s}`, stream, extra))
}

// pdLegs is one chat request sent through the shared PD stack, with the
// engines that served its two legs and what they recorded.
type pdLegs struct {
	ID                    string
	DecodeSim, PrefillSim *harness.Sim
	Decode, Prefill       harness.Record
}

// pdChat sends chat request number i of the test through pd and returns
// both legs; a non-200 answer fails the test.
func pdChat(t *testing.T, i int) pdLegs {
	t.Helper()
	r := pdLegs{ID: requestID(t, i)}
	resp, body := send(t, pd, "POST", "/v1/chat/completions", map[string]string{"x-request-id": r.ID}, chatBody(false, ""))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	r.DecodeSim, r.Decode = only(t, legs(t, pd.Decode, r.ID, 1))
	r.PrefillSim, r.Prefill = only(t, legs(t, pd.Prefill, r.ID, 1))
	return r
}
