package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// Claim: the mirror carries the request exactly as ext_proc rewrote it (body
// and content-length), so both legs see one bootstrap room and host.
func TestMirrorReceivesRewrittenBody(t *testing.T) {
	r := pdChat(t, 0)
	dec, pre := r.Decode, r.Prefill
	if !bytes.Equal(dec.Body, pre.Body) {
		t.Errorf("legs got different bodies:\ndecode:  %s\nprefill: %s", dec.Body, pre.Body)
	}
	for _, leg := range []harness.Record{dec, pre} {
		if leg.Headers["content-length"] != strconv.Itoa(len(leg.Body)) {
			t.Errorf("%s leg: content-length %q, body %d bytes", leg.Mode, leg.Headers["content-length"], len(leg.Body))
		}
		if len(leg.Rooms()) != 1 || leg.Host() == "" || leg.BootstrapPort == nil {
			t.Errorf("%s leg: bootstrap fields missing: %s", leg.Mode, leg.Body)
		}
		if leg.Status != 200 || leg.Error != "" {
			t.Errorf("%s leg failed: %d %s", leg.Mode, leg.Status, leg.Error)
		}
	}
}

// Claim: the main request and the mirror reach the hosts named by their own
// headers (override_host), and the body's bootstrap address is the prefill
// that received the mirror.
func TestLegsReachHostsNamedByHeaders(t *testing.T) {
	usedPrefill, usedDecode := map[string]int{}, map[string]int{}
	for i := range 8 {
		id := requestID(t, i)
		resp, body := send(t, pd, "POST", "/v1/completions", map[string]string{"x-request-id": id},
			[]byte(`{"model":"sim-model","prompt":"hello","max_tokens":4}`))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		decSim, dec := only(t, legs(t, pd.Decode, id, 1))
		preSim, pre := only(t, legs(t, pd.Prefill, id, 1))
		// duet names the chosen decode host first and the other decode
		// engine second, for Envoy's connect-failure retry.
		named, fallback, _ := strings.Cut(dec.Headers["x-duet-decode-endpoint"], ",")
		if named != decSim.Address {
			t.Errorf("decode leg reached %s but duet named %s first", decSim.Address, named)
		}
		if fallback == "" || fallback == named {
			t.Errorf("decode fallback %q, want the other decode engine", fallback)
		}
		if got := pre.Headers["x-duet-prefill-endpoint"]; got != preSim.Address {
			t.Errorf("mirror reached %s but duet named %s", preSim.Address, got)
		}
		host, _, _ := net.SplitHostPort(preSim.Address)
		if dec.Host() != host || dec.BootstrapPort == nil || *dec.BootstrapPort != preSim.BootstrapPort {
			t.Errorf("bootstrap %s:%v does not name the prefill that got the mirror (%s, bootstrap port %d)",
				dec.Host(), dec.BootstrapPort, preSim.Address, preSim.BootstrapPort)
		}
		usedPrefill[preSim.Name]++
		usedDecode[decSim.Name]++
	}
	if len(usedPrefill) != 2 || len(usedDecode) != 2 {
		t.Errorf("duet's choices did not reach every engine: prefill %v decode %v", usedPrefill, usedDecode)
	}
}

// Claim: the decode leg carries the decode rank in X-Data-Parallel-Rank and
// the prefill leg carries the prefill rank (the mirror's header mutation),
// which matches bootstrap_room % prefill_dp_size, so SGLang's conflict check
// passes and decode finds the KV on the right prefill rank.
func TestPerLegDPRank(t *testing.T) {
	differ := 0
	for i := range 8 {
		r := pdChat(t, i)
		dec, preSim, pre := r.Decode, r.PrefillSim, r.Prefill
		if dec.DPRank == nil || dec.Source() != "header" || dec.Headers["x-data-parallel-rank"] != strconv.Itoa(*dec.DPRank) {
			t.Fatalf("decode leg not pinned by header: rank %v source %q header %q", dec.DPRank, dec.Source(), dec.Headers["x-data-parallel-rank"])
		}
		if pre.DPRank == nil || pre.Source() != "header" {
			t.Fatalf("prefill leg not pinned by its own header: rank %v source %q", pre.DPRank, pre.Source())
		}
		room := pre.Rooms()[0]
		if want := int(room % uint64(preSim.DPSize)); *pre.DPRank != want {
			t.Errorf("prefill rank %d, but room %d %% %d = %d", *pre.DPRank, room, preSim.DPSize, want)
		}
		if dec.PrefillDPRank == nil || *dec.PrefillDPRank != *pre.DPRank {
			t.Errorf("decode looked for KV on prefill rank %v, prefill ran on %d", dec.PrefillDPRank, *pre.DPRank)
		}
		if pre.Headers["x-data-parallel-rank"] != pre.Headers["x-duet-prefill-dp-rank"] {
			t.Errorf("prefill leg rank header %q != duet's prefill rank %q", pre.Headers["x-data-parallel-rank"], pre.Headers["x-duet-prefill-dp-rank"])
		}
		if *dec.DPRank != *pre.DPRank {
			differ++
		}
	}
	if differ == 0 {
		t.Error("decode and prefill ranks never differed, so per-leg headers were not exercised")
	}
}

// /generate: SGLang ignores the rank header there; the prefill rank still
// travels in the room, and batches get one room per item.
func TestGenerateBatch(t *testing.T) {
	id := requestID(t, 0)
	resp, body := send(t, pd, "POST", "/generate", map[string]string{"x-request-id": id},
		[]byte(`{"text":["one","two","three"],"sampling_params":{"max_new_tokens":4}}`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var results []map[string]any
	if err := json.Unmarshal(body, &results); err != nil || len(results) != 3 {
		t.Fatalf("want 3 results, got %s (%v)", body, err)
	}
	_, dec := only(t, legs(t, pd.Decode, id, 1))
	preSim, pre := only(t, legs(t, pd.Prefill, id, 1))
	if len(pre.Rooms()) != 3 || len(dec.Rooms()) != 3 {
		t.Fatalf("rooms: prefill %v decode %v, want 3 each", pre.Rooms(), dec.Rooms())
	}
	seen := map[uint64]bool{}
	for _, room := range pre.Rooms() {
		if int(room%uint64(preSim.DPSize)) != *pre.DPRank {
			t.Errorf("room %d does not map to prefill rank %d", room, *pre.DPRank)
		}
		seen[room] = true
	}
	if len(seen) != 3 {
		t.Errorf("rooms not distinct: %v", pre.Rooms())
	}
	if pre.Source() != "room" {
		t.Errorf("/generate prefill rank source = %q, want room (header is ignored there)", pre.Source())
	}
	// The decode leg's rank reaches SGLang in its own body (the decode
	// cluster's Lua filter); the prefill leg's body stays shared.
	want := dec.Headers["x-duet-decode-body-rank"]
	if want == "" || dec.Source() != "body" || dec.DPRank == nil || strconv.Itoa(*dec.DPRank) != want {
		t.Errorf("/generate decode leg: rank %v from %q, want %s from the body", dec.DPRank, dec.Source(), want)
	}
	if bytes.Contains(pre.Body, []byte("routed_dp_rank")) {
		t.Errorf("the prefill leg's body carries the decode rank: %s", pre.Body)
	}
}

// Streaming responses reach the client as SSE events, token by token.
func TestStreamingReachesClient(t *testing.T) {
	id := requestID(t, 0)
	resp, body := send(t, pd, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(true, ""))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("content-type"); ct != "text/event-stream" && !bytes.HasPrefix([]byte(ct), []byte("text/event-stream")) {
		t.Errorf("content-type %q", ct)
	}
	events := bytes.Count(body, []byte("data: "))
	if events < 8 || !bytes.Contains(body, []byte("data: [DONE]")) {
		t.Errorf("want ≥8 SSE events ending in [DONE], got %d:\n%s", events, body)
	}
	legs(t, pd.Prefill, id, 1)
}

// Requests that are not inference (GET /v1/models, unknown paths) go to a
// decode engine unchanged and are never mirrored.
func TestNonInferenceNotMirrored(t *testing.T) {
	pre0, dec0 := upstreamRequests(t, pd)
	resp, body := send(t, pd, "GET", "/v1/models", nil, nil)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("sim-model")) {
		t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, body)
	}
	resp, _ = send(t, pd, "POST", "/v1/embeddings", nil, []byte(`{"input":"x"}`))
	if resp.StatusCode != 404 {
		t.Errorf("unknown path: status %d, want the engine's 404", resp.StatusCode)
	}
	pre1, dec1 := upstreamRequests(t, pd)
	if pre1 != pre0 || dec1 != dec0+2 {
		t.Errorf("upstream requests: prefill %d→%d (want unchanged), decode %d→%d (want +2)", pre0, pre1, dec0, dec1)
	}
}

// Aggregated pools (no prefill list): one leg, no mirror, no bootstrap
// fields; the rank is pinned (header on OpenAI routes, body on /generate).
func TestAggregatedNoMirror(t *testing.T) {
	s := startStack(t, harness.Options{Decode: []harness.SimSpec{{DPSize: 2}, {DPSize: 2}}})
	for i, tc := range []struct {
		path, body, source string
	}{
		{"/v1/chat/completions", string(chatBody(false, "")), "header"},
		{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":4}}`, "body"},
	} {
		id := requestID(t, i)
		resp, body := send(t, s, "POST", tc.path, map[string]string{"x-request-id": id}, []byte(tc.body))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", tc.path, resp.StatusCode, body)
		}
		_, rec := only(t, legs(t, s.Decode, id, 1))
		if rec.Mode != "null" || len(rec.Rooms()) != 0 || rec.DPRank == nil || rec.Source() != tc.source {
			t.Errorf("%s: mode %s rooms %v rank pinned %v source %q (want %s)", tc.path, rec.Mode, rec.Rooms(), rec.DPRank != nil, rec.Source(), tc.source)
		}
		if bytes.Contains(rec.Body, []byte("bootstrap")) || rec.Headers["x-duet-mirror"] != "" {
			t.Errorf("%s: aggregated request carries PD routing: %s %v", tc.path, rec.Body, rec.Headers)
		}
	}
	if n := stat(t, s, "cluster.duet_prefill.upstream_rq_total"); n != 0 {
		t.Errorf("aggregated stack sent %d prefill requests", n)
	}
}

// engine_ranks: duet picks engines only; the prefill rank follows the
// random room (SGLang's follow_bootstrap_room) and decode round-robins.
// Requests still succeed: this is the baseline the benchmark compares with.
func TestEngineRanksBaseline(t *testing.T) {
	s := startStack(t, harness.Options{
		Prefill:     []harness.SimSpec{{DPSize: 4}},
		Decode:      []harness.SimSpec{{DPSize: 2}},
		EngineRanks: true,
	})
	prefillRanks := map[int]bool{}
	for i, path := range []string{"/v1/chat/completions", "/generate", "/v1/chat/completions", "/generate", "/v1/completions", "/v1/completions", "/v1/chat/completions", "/generate"} {
		id := requestID(t, i)
		body := chatBody(false, "")
		switch path {
		case "/generate":
			body = []byte(`{"text":"hello","sampling_params":{"max_new_tokens":4}}`)
		case "/v1/completions":
			body = []byte(`{"model":"sim-model","prompt":"hello","max_tokens":4}`)
		}
		resp, out := send(t, s, "POST", path, map[string]string{"x-request-id": id}, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, out)
		}
		_, dec := only(t, legs(t, s.Decode, id, 1))
		_, pre := only(t, legs(t, s.Prefill, id, 1))
		if pre.Source() != "room" || dec.Source() != "round_robin" {
			t.Errorf("%s: prefill rank from %q, decode rank from %q; want room and round_robin", path, pre.Source(), dec.Source())
		}
		if bytes.Contains(dec.Body, []byte("disagg_prefill_dp_rank")) {
			t.Errorf("%s: duet pinned the prefill rank: %s", path, dec.Body)
		}
		prefillRanks[*pre.DPRank] = true
	}
	if len(prefillRanks) < 2 {
		t.Errorf("random rooms used only prefill ranks %v", prefillRanks)
	}
}
