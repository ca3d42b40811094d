package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// readyz returns duet's /readyz answer.
func readyz(t *testing.T, s *harness.Stack) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), requestTimeout)
	defer cancel()
	resp, b, err := harness.Send(ctx, s.DuetAdminURL, http.MethodGet, "/readyz", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Swapped roles (issue 30): a prefill engine listed as decode and a decode
// engine listed as prefill are never scheduled. Through the real Envoy,
// the client gets duet's 503 saying which role has no usable engine and
// why, never a 200 with a truncated answer; no request reaches an engine;
// /readyz is 503 and names both engines with the mode each reports and the
// mode its role needs.
func TestSwappedRolesAreNotServed(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:     []harness.SimSpec{{Mode: "decode"}},
		Decode:      []harness.SimSpec{{Mode: "prefill"}},
		NoWaitReady: true,
	})
	prefill, decode := s.Prefill[0], s.Decode[0]
	wantReady := fmt.Sprintf("not ready: no usable prefill engine: prefill engine %s reports disaggregation_mode \"decode\", expected \"prefill\"; "+
		"no usable decode engine: decode engine %s reports disaggregation_mode \"prefill\", expected \"decode\"\n", prefill.URL, decode.URL)
	var code int
	var body string
	harness.WaitFor(t, 10*time.Second, "/readyz to name both engines", func() bool {
		code, body = readyz(t, s)
		return code == http.StatusServiceUnavailable && body == wantReady
	})

	for _, stream := range []bool{false, true} {
		resp, out := send(t, s, http.MethodPost, "/v1/chat/completions", nil, chatBody(stream, ""))
		checkOpenAIError(t, resp, out, http.StatusServiceUnavailable, "server_error")
		e, err := parseOpenAIError(out)
		want := `no inference endpoint of pool default is available: scheduler: pick decode: no ready endpoint: ` +
			`1 of 1 decode engines report a disaggregation_mode other than "decode" (see duet's /readyz)`
		if err != nil || e.Message != want {
			t.Errorf("stream=%v: message %q, want %q", stream, e.Message, want)
		}
	}
	for _, sim := range []*harness.Sim{prefill, decode} {
		recs, err := sim.Requests(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 0 {
			t.Errorf("%s (%s mode) got %d requests, want none", sim.Name, sim.Mode, len(recs))
		}
	}
	mfs, err := s.DuetMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"prefill", "decode"} {
		if n := harness.SumMetric(mfs, "duet_endpoints_not_ready", map[string]string{"role": role, "reason": "wrong_mode"}); n != 1 {
			t.Errorf("duet_endpoints_not_ready{role=%s,reason=wrong_mode} = %v, want 1", role, n)
		}
	}
	var page struct {
		Endpoints []struct {
			Role, URL          string
			Ready              bool
			WrongMode          bool   `json:"wrong_mode"`
			DisaggregationMode string `json:"disaggregation_mode"`
			ExpectedMode       string `json:"expected_mode"`
			NotReadyReason     string `json:"not_ready_reason"`
		} `json:"endpoints"`
	}
	if err := harness.GetJSON(context.Background(), s.DuetAdminURL+"/status.json", &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Endpoints) != 2 {
		t.Fatalf("/status.json endpoints = %+v", page.Endpoints)
	}
	for _, e := range page.Endpoints {
		if e.Ready || !e.WrongMode || e.DisaggregationMode == e.ExpectedMode || !strings.Contains(body, e.NotReadyReason) {
			t.Errorf("/status.json endpoint %+v: want not ready in the wrong mode, with /readyz's reason", e)
		}
	}
}

// An engine down when duet starts is served soon after it comes up, not
// at the next discovery round (10 s here): duet probes it again with a
// backoff from 250 ms. Meanwhile /readyz names the role and the engine it
// waits for, and requests get duet's 503.
func TestEngineDownAtStartIsServedSoon(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:           []harness.SimSpec{{}},
		Decode:            []harness.SimSpec{{Down: true}},
		DiscoveryInterval: 10 * time.Second,
		NoWaitReady:       true,
	})
	decode := s.Decode[0]
	code, body := readyz(t, s)
	want := fmt.Sprintf("not ready: no usable decode engine: waiting for decode engine %s: ", decode.URL)
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, want) {
		t.Errorf("/readyz = %d %q, want 503 starting %q", code, body, want)
	}
	resp, out := send(t, s, http.MethodPost, "/v1/chat/completions", nil, chatBody(false, ""))
	checkOpenAIError(t, resp, out, http.StatusServiceUnavailable, "server_error")
	if e, _ := parseOpenAIError(out); !strings.HasSuffix(e.Message, "no ready endpoint: 1 of 1 decode engines not reached by discovery yet (see duet's /readyz)") {
		t.Errorf("message %q, want the decode engine counted as not reached", e.Message)
	}

	// Bring the engine up at least 1 s after duet started.
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := decode.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	for {
		resp, out := send(t, s, http.MethodPost, "/v1/chat/completions", nil, chatBody(false, ""))
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Since(up) > 3*time.Second {
			t.Fatalf("not served %v after the engine came up (discovery.interval 10s): %d %s", time.Since(up), resp.StatusCode, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("served %v after the engine came up", time.Since(up).Round(time.Millisecond))
	if code, body := readyz(t, s); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz = %d %q, want ready", code, body)
	}
}
