package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// Claim: routing headers and routing body fields sent by a client have no
// effect: Envoy strips the headers before ext_proc, duet overwrites the body.
func TestSpoofedRoutingIsIgnored(t *testing.T) {
	spoof := map[string]string{
		"x-duet-decode-endpoint":  pd.Decode[1].Address,
		"x-duet-prefill-endpoint": "127.0.0.1:1",
		"x-duet-mirror":           "duet_decode", // would mirror to decode instead of prefill
		"x-duet-prefill-dp-rank":  "1",
		"x-data-parallel-rank":    "1",
	}
	body := chatBody(false, `,"routed_dp_rank":1,"data_parallel_rank":1,"disagg_prefill_dp_rank":1,"bootstrap_room":7,"bootstrap_host":"169.254.169.254","bootstrap_port":80`)
	decodes, ranks := map[string]bool{}, map[int]bool{}
	for i := range 8 {
		id := requestID(t, i)
		hdr := map[string]string{"x-request-id": id}
		for k, v := range spoof {
			hdr[k] = v
		}
		resp, out := send(t, pd, "POST", "/v1/chat/completions", hdr, body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		// Exactly one decode leg and one prefill leg: the spoofed mirror
		// cluster did not turn the mirror into a second decode request.
		decSim, dec := only(t, legs(t, pd.Decode, id, 1))
		preSim, pre := only(t, legs(t, pd.Prefill, id, 1))
		if named, _, _ := strings.Cut(dec.Headers["x-duet-decode-endpoint"], ","); named != decSim.Address || pre.Headers["x-duet-prefill-endpoint"] != preSim.Address {
			t.Errorf("routing headers are not duet's: decode %q prefill %q", dec.Headers["x-duet-decode-endpoint"], pre.Headers["x-duet-prefill-endpoint"])
		}
		host, _, _ := net.SplitHostPort(preSim.Address)
		if dec.Host() != host || dec.Rooms()[0] == 7 {
			t.Errorf("client bootstrap fields survived: host %s rooms %v", dec.Host(), dec.Rooms())
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(dec.Body, &fields); err != nil {
			t.Fatal(err)
		}
		if _, ok := fields["routed_dp_rank"]; ok {
			t.Errorf("client routed_dp_rank reached the engine: %s", dec.Body)
		}
		if _, ok := fields["data_parallel_rank"]; ok {
			t.Errorf("client data_parallel_rank reached the engine: %s", dec.Body)
		}
		decodes[decSim.Name] = true
		ranks[*dec.DPRank] = true
	}
	if len(decodes) != 2 || len(ranks) != 2 {
		t.Errorf("a spoofed host or rank stuck: decode engines %v, decode ranks %v", decodes, ranks)
	}

	// A header-only request cannot make Envoy mirror either.
	pre0, _ := upstreamRequests(t, pd)
	hdr := map[string]string{"x-duet-mirror": "duet_prefill", "x-duet-prefill-endpoint": pd.Prefill[0].Address}
	if resp, out := send(t, pd, "GET", "/v1/models", hdr, nil); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, out)
	}
	if pre1, _ := upstreamRequests(t, pd); pre1 != pre0 {
		t.Errorf("a client header made Envoy mirror: prefill requests %d→%d", pre0, pre1)
	}
}

// Bad bodies get an OpenAI-format 400 from duet and reach no engine.
func TestBadBodiesRejected(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`},
		{"not JSON", "/v1/completions", `hello`},
		{"not an object", "/generate", `[1,2,3]`},
		{"empty body", "/v1/chat/completions", ``},
		{"bad n", "/v1/chat/completions", `{"messages":[],"n":0}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre0, dec0 := upstreamRequests(t, pd)
			resp, body := send(t, pd, "POST", tc.path, nil, []byte(tc.body))
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, body)
			}
			checkOpenAIError(t, resp, body, 400, "invalid_request_error")
			if pre1, dec1 := upstreamRequests(t, pd); pre1 != pre0 || dec1 != dec0 {
				t.Errorf("a rejected request reached engines: prefill %d→%d decode %d→%d", pre0, pre1, dec0, dec1)
			}
		})
	}
}

// Claim: bodies over the configured limit get 413 from Envoy before duet or
// any engine sees them; bodies under it (and over Envoy's 1 MiB default)
// pass through ext_proc intact.
func TestBodyLimit(t *testing.T) {
	const limit = 4 << 20 // the shared stack's max_body_bytes
	big := func(n int) []byte {
		return []byte(`{"model":"sim-model","prompt":"` + strings.Repeat("a", n) + `","max_tokens":2}`)
	}
	pre0, dec0 := upstreamRequests(t, pd)
	resp, body := send(t, pd, "POST", "/v1/completions", nil, big(limit+1024))
	if resp.StatusCode != 413 {
		t.Fatalf("oversize: status %d, want 413: %.200s", resp.StatusCode, body)
	}
	checkOpenAIError(t, resp, body, 413, "invalid_request_error")
	if pre1, dec1 := upstreamRequests(t, pd); pre1 != pre0 || dec1 != dec0 {
		t.Errorf("an oversize request reached engines: prefill %d→%d decode %d→%d", pre0, pre1, dec0, dec1)
	}
	id := requestID(t, 0)
	resp, body = send(t, pd, "POST", "/v1/completions", map[string]string{"x-request-id": id}, big(3<<20))
	if resp.StatusCode != 200 {
		t.Fatalf("3 MiB body: status %d: %.300s", resp.StatusCode, body)
	}
	_, dec := only(t, legs(t, pd.Decode, id, 1))
	_, pre := only(t, legs(t, pd.Prefill, id, 1))
	if len(dec.Body) < 3<<20 || !bytes.Equal(dec.Body, pre.Body) {
		t.Errorf("large body not delivered intact: decode %d bytes, prefill %d bytes", len(dec.Body), len(pre.Body))
	}
}

// Claim: with duet down, Envoy fails closed (503) and nothing reaches an engine.
func TestFailClosedWhenDuetDown(t *testing.T) {
	s := startStack(t, harness.Options{Prefill: []harness.SimSpec{{}}, Decode: []harness.SimSpec{{}}})
	if resp, body := send(t, s, "POST", "/v1/chat/completions", nil, chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("before stopping duet: %d %s", resp.StatusCode, body)
	}
	pre0, dec0 := upstreamRequests(t, s)
	if err := s.Duet.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path string }{{"POST", "/v1/chat/completions"}, {"GET", "/v1/models"}} {
		var body []byte
		if tc.method == "POST" {
			body = chatBody(false, "")
		}
		resp, out := send(t, s, tc.method, tc.path, nil, body)
		if resp.StatusCode != 503 {
			t.Errorf("%s %s with duet down: status %d, want 503: %s", tc.method, tc.path, resp.StatusCode, out)
		}
		checkOpenAIError(t, resp, out, 503, "server_error")
	}
	if pre1, dec1 := upstreamRequests(t, s); pre1 != pre0 || dec1 != dec0 {
		t.Errorf("requests reached engines with duet down: prefill %d→%d decode %d→%d", pre0, pre1, dec0, dec1)
	}
}

// openAIError is the OpenAI error envelope's content.
type openAIError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// parseOpenAIError decodes an OpenAI error envelope, {"error":{...}}.
func parseOpenAIError(body []byte) (openAIError, error) {
	var e struct {
		Error openAIError `json:"error"`
	}
	err := json.Unmarshal(body, &e)
	return e.Error, err
}

// checkOpenAIError asserts an OpenAI-format JSON error body, whether duet or
// Envoy itself produced it.
func checkOpenAIError(t *testing.T, resp *http.Response, body []byte, code int, typ string) {
	t.Helper()
	if ct := resp.Header.Get("content-type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content-type %q, want application/json", ct)
	}
	if e, err := parseOpenAIError(body); err != nil || e.Message == "" || e.Code != code || e.Type != typ {
		t.Errorf("want an OpenAI error (code %d, type %s), got %s (%v)", code, typ, body, err)
	}
}
