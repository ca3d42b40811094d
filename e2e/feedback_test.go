package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/extproc/accesslog"
)

// completions waits until duet's /debug/completions holds want entries for
// request id (the three legs arrive on two ALS streams, in any order, after
// the client already has its response) and returns them by leg.
func completions(t *testing.T, s *harness.Stack, id string, want int) map[accesslog.Leg]accesslog.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+requestTimeout)
	defer cancel()
	got, err := harness.WaitCompletions[accesslog.Completion](ctx, s, id, want, 10*time.Second)
	byLeg := map[accesslog.Leg]accesslog.Completion{}
	for _, c := range got {
		if _, dup := byLeg[c.Leg]; dup {
			t.Errorf("request %s: two %s entries: %+v", id, c.Leg, got)
		}
		byLeg[c.Leg] = c
	}
	if err != nil {
		t.Fatal(err)
	}
	return byLeg
}

// usage is the token usage an engine reported to the client.
type usage struct{ prompt, completion int64 }

// jsonUsage reads "usage" (OpenAI) or "meta_info" (/generate) of a JSON body.
func jsonUsage(t *testing.T, body []byte) usage {
	t.Helper()
	type counts struct {
		Prompt     int64 `json:"prompt_tokens"`
		Completion int64 `json:"completion_tokens"`
	}
	var v struct {
		Usage    *counts `json:"usage"`
		MetaInfo *counts `json:"meta_info"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("response body: %v: %s", err, body)
	}
	for _, u := range []*counts{v.Usage, v.MetaInfo} {
		if u != nil {
			return usage{u.Prompt, u.Completion}
		}
	}
	return usage{}
}

// sseUsage reads the usage of the last SSE event that has one.
func sseUsage(t *testing.T, body []byte) usage {
	t.Helper()
	var u usage
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" || !strings.Contains(data, `"usage"`) {
			continue
		}
		if got := jsonUsage(t, []byte(data)); got != (usage{}) {
			u = got
		}
	}
	return u
}

// Claims: the router's gRPC upstream_log sends one entry for the decode
// request and one for the prefill SHADOW (upstream_cluster duet_prefill,
// upstream host = the prefill engine that got the mirror); the HCM's gRPC
// access_log sends one entry for the whole request. Only the downstream
// entry carries the duet dynamic metadata: duet's targets, and the token
// usage that json_to_metadata (JSON responses) and sse_to_metadata (SSE,
// include_usage) copied from the engine's response.
func TestFeedbackReportsEveryLeg(t *testing.T) {
	include := `,"stream_options":{"include_usage":true}`
	tests := []struct {
		name, path, body string
		stream           bool
		// usage: whether the engine reports usage the filters can read.
		usage bool
	}{
		{"chat", "/v1/chat/completions", string(chatBody(false, "")), false, true},
		{"chat stream with include_usage", "/v1/chat/completions", string(chatBody(true, include)), true, true},
		{"chat stream without usage", "/v1/chat/completions", string(chatBody(true, "")), true, false},
		{"completions", "/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":5}`, false, true},
		{"completions stream with include_usage", "/v1/completions",
			`{"model":"sim-model","prompt":"hello","max_tokens":5,"stream":true` + include + `}`, true, true},
		{"generate", "/generate", `{"text":"hello there","sampling_params":{"max_new_tokens":6}}`, false, true},
		// /generate streams are left to the engine's metrics: their events
		// repeat the whole text, so sse_to_metadata does not parse them.
		{"generate stream", "/generate", `{"text":"hello","sampling_params":{"max_new_tokens":6},"stream":true}`, true, false},
		// A batch answers with a JSON list: json_to_metadata reads objects only.
		{"generate batch", "/generate", `{"text":["a","b"],"sampling_params":{"max_new_tokens":3}}`, false, false},
	}
	before := feedbackMetrics(t, pd)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := requestID(t, i)
			resp, body := send(t, pd, "POST", tt.path, map[string]string{"x-request-id": id}, []byte(tt.body))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var want usage
			switch {
			case !tt.usage:
			case tt.stream:
				want = sseUsage(t, body)
			default:
				want = jsonUsage(t, body)
			}
			if tt.usage && (want.prompt == 0 || want.completion == 0) {
				t.Fatalf("the engine reported no usage: %s", body)
			}
			decSim, _ := only(t, legs(t, pd.Decode, id, 1))
			preSim, pre := only(t, legs(t, pd.Prefill, id, 1))
			got := completions(t, pd, id, 3)

			dec, prefill, req := got[accesslog.LegDecode], got[accesslog.LegPrefill], got[accesslog.LegRequest]
			for _, c := range []struct {
				c        accesslog.Completion
				cluster  string
				upstream string
			}{
				{dec, "duet_decode", decSim.Address},
				{prefill, "duet_prefill", preSim.Address},
				{req, "duet_decode", decSim.Address},
			} {
				if c.c.Cluster != c.cluster || c.c.Upstream != c.upstream || c.c.Status != 200 || c.c.Failed || c.c.ResponseFlags != "" {
					t.Errorf("%s leg: %+v, want cluster %s upstream %s status 200", c.c.Leg, c.c, c.cluster, c.upstream)
				}
				if c.c.Duration <= 0 {
					t.Errorf("%s leg: no duration", c.c.Leg)
				}
			}
			// The shadow's entry logs the shadow's own header copy: the
			// prefill rank the mirror policy wrote, as the engine saw it.
			if prefill.DPRank != *pre.DPRank || strconv.Itoa(prefill.DPRank) != pre.Headers["x-data-parallel-rank"] {
				t.Errorf("prefill leg logged rank %d, the prefill engine got %q", prefill.DPRank, pre.Headers["x-data-parallel-rank"])
			}
			if !strings.HasPrefix(req.DecodeTarget, decSim.Address+"/") || !strings.HasPrefix(req.PrefillTarget, preSim.Address+"/") {
				t.Errorf("request entry targets %q %q, want %s/… and %s/…", req.DecodeTarget, req.PrefillTarget, decSim.Address, preSim.Address)
			}
			if (usage{req.PromptTokens, req.CompletionTokens}) != want {
				t.Errorf("request entry usage %d/%d, engine reported %d/%d", req.PromptTokens, req.CompletionTokens, want.prompt, want.completion)
			}
			// The upstream entries have no dynamic metadata on 1.40.
			for _, c := range []accesslog.Completion{dec, prefill} {
				if c.DecodeTarget != "" || c.PrefillTarget != "" || c.PromptTokens != 0 || c.CompletionTokens != 0 {
					t.Errorf("%s leg carries metadata: %+v", c.Leg, c)
				}
			}
		})
	}
	after := feedbackMetrics(t, pd)
	for _, leg := range []string{"decode", "prefill", "request"} {
		if d := after["entries/"+leg+"/ok"] - before["entries/"+leg+"/ok"]; d < float64(len(tests)) {
			t.Errorf("duet_feedback_entries_total{leg=%q,outcome=\"ok\"} grew by %v, want ≥ %d", leg, d, len(tests))
		}
	}
	if after["streams"] != 2 {
		t.Errorf("duet_feedback_streams = %v, want 2 (downstream and upstream loggers)", after["streams"])
	}
}

// feedbackMetrics scrapes duet's feedback metrics: "entries/<leg>/<outcome>"
// and "streams".
func feedbackMetrics(t *testing.T, s *harness.Stack) map[string]float64 {
	t.Helper()
	mfs := duetMetrics(t, s)
	out := map[string]float64{}
	if mf := mfs["duet_feedback_streams"]; mf != nil {
		out["streams"] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	for _, m := range mfs["duet_feedback_entries_total"].GetMetric() {
		labels := labelsOf(m)
		out["entries/"+labels["leg"]+"/"+labels["outcome"]] = m.GetCounter().GetValue()
	}
	return out
}

// Claim: the prefill leg's entry is its own, not a copy of the main
// request's: across requests where duet chose different decode and prefill
// ranks, each leg's entry logs its own X-Data-Parallel-Rank.
func TestFeedbackPerLegRank(t *testing.T) {
	differ := 0
	for i := range 8 {
		r := pdChat(t, i)
		dec, pre := r.Decode, r.Prefill
		got := completions(t, pd, r.ID, 3)
		if got[accesslog.LegDecode].DPRank != *dec.DPRank || got[accesslog.LegRequest].DPRank != *dec.DPRank {
			t.Errorf("decode rank %d, logged %d (upstream) and %d (request)", *dec.DPRank, got[accesslog.LegDecode].DPRank, got[accesslog.LegRequest].DPRank)
		}
		if got[accesslog.LegPrefill].DPRank != *pre.DPRank {
			t.Errorf("prefill rank %d, logged %d", *pre.DPRank, got[accesslog.LegPrefill].DPRank)
		}
		if *dec.DPRank != *pre.DPRank {
			differ++
		}
	}
	if differ == 0 {
		t.Error("decode and prefill ranks never differed, so per-leg entries were not exercised")
	}
}

// Claim: a prefill leg that fails (the prefill engine is down) shows up as
// the shadow's upstream entry with no response and the UF flag, naming the
// host it tried; the decode leg and the request carry their own outcome.
func TestFeedbackFailedPrefillLeg(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:   []harness.SimSpec{{DPSize: 1}},
		Decode:    []harness.SimSpec{{DPSize: 1}},
		KVTimeout: time.Second,
	})
	prefillAddr := s.Prefill[0].Address
	if err := s.Prefill[0].Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	id := requestID(t, 0)
	resp, body := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false, ""))
	if resp.StatusCode < 500 {
		t.Fatalf("status %d with the prefill engine down: %s", resp.StatusCode, body)
	}
	got := completions(t, s, id, 3)
	prefill := got[accesslog.LegPrefill]
	if !prefill.Failed || prefill.Status != 0 || prefill.ResponseFlags != "UF" || prefill.Upstream != prefillAddr || prefill.Cluster != "duet_prefill" {
		t.Errorf("prefill leg: %+v, want failed, status 0, flags UF, upstream %s", prefill, prefillAddr)
	}
	for _, leg := range []accesslog.Leg{accesslog.LegDecode, accesslog.LegRequest} {
		if c := got[leg]; !c.Failed || c.Status != resp.StatusCode || c.Upstream != s.Decode[0].Address {
			t.Errorf("%s leg: %+v, want failed with the client's status %d", leg, c, resp.StatusCode)
		}
	}
	m := feedbackMetrics(t, s)
	if m["entries/prefill/failed"] != 1 {
		t.Errorf("duet_feedback_entries_total{leg=\"prefill\",outcome=\"failed\"} = %v, want 1", m["entries/prefill/failed"])
	}
}

// Claim (a cost of json_to_metadata): it buffers a JSON response to parse
// it, within the connection's buffer limit (request.max_body_bytes). A
// larger JSON response gets Envoy's 500 response_payload_too_large, although
// the engine answered 200; SSE responses are never buffered.
func TestJSONUsageBuffersResponses(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:      []harness.SimSpec{{DPSize: 1}},
		Decode:       []harness.SimSpec{{DPSize: 1, Args: []string{"--decode-ms-per-token", "0"}}},
		MaxBodyBytes: 16 << 10,
	})
	big := func(stream bool) []byte {
		return []byte(fmt.Sprintf(`{"model":"sim-model","prompt":"hello","max_tokens":4000,"stream":%v}`, stream))
	}
	id := requestID(t, 0)
	resp, body := send(t, s, "POST", "/v1/completions", map[string]string{"x-request-id": id}, big(false))
	checkOpenAIError(t, resp, body, http.StatusInternalServerError, "server_error")
	if msg := gjson.GetBytes(body, "error.message").String(); msg != envoy.ResponseTooLargeMessage(16<<10) {
		t.Errorf("message %q, want %q", msg, envoy.ResponseTooLargeMessage(16<<10))
	}
	got := completions(t, s, id, 3)
	if c := got[accesslog.LegDecode]; c.Status != 200 || c.Failed {
		t.Errorf("decode leg: %+v, want the engine's 200", c)
	}
	if c := got[accesslog.LegRequest]; c.Status != 500 || !c.Failed {
		t.Errorf("request: %+v, want 500", c)
	}
	resp, body = send(t, s, "POST", "/v1/completions", map[string]string{"x-request-id": requestID(t, 1)}, big(true))
	if resp.StatusCode != 200 || len(body) <= 16<<10 || !bytes.Contains(body, []byte("data: [DONE]")) {
		t.Errorf("stream larger than the limit: status %d, %d bytes", resp.StatusCode, len(body))
	}
}

// Claim: sse_to_metadata parses a copy and never holds events back: the
// first event reaches the client long before the stream ends.
func TestSSEUsageDoesNotHoldBackEvents(t *testing.T) {
	req, err := http.NewRequest("POST", pd.EnvoyURL+"/v1/chat/completions", bytes.NewReader([]byte(
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":150,"stream":true,"stream_options":{"include_usage":true}}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	start := time.Now()
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var first time.Duration
	for sc.Scan() {
		if first == 0 && strings.HasPrefix(sc.Text(), "data: ") {
			first = time.Since(start)
		}
	}
	total := time.Since(start)
	if resp.StatusCode != 200 || first == 0 {
		t.Fatalf("status %d, no event", resp.StatusCode)
	}
	// 150 tokens at 2 ms each: the stream lasts ≥ 300 ms.
	if first > total/2 {
		t.Errorf("first event after %v of %v: events were held back", first, total)
	}
}

// Envoy's access-log streams never end on their own: duet ends them when it
// stops, so its graceful stop does not wait out the shutdown grace.
func TestDuetStopsWithFeedbackStreamsOpen(t *testing.T) {
	s := startStack(t, harness.Options{Prefill: []harness.SimSpec{{}}, Decode: []harness.SimSpec{{}}})
	id := requestID(t, 0)
	if resp, body := send(t, s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	completions(t, s, id, 3)
	if n := feedbackMetrics(t, s)["streams"]; n != 2 {
		t.Fatalf("duet_feedback_streams = %v, want 2", n)
	}
	start := time.Now()
	if err := s.Duet.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("duet took %v to stop with the access-log streams open", d)
	}
}
