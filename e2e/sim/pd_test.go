package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestMissingRoomAndBatchLists(t *testing.T) {
	prefill := startTest(t, Config{Mode: ModePrefill, DPSize: 2})
	decode := startTest(t, Config{Mode: ModeDecode, DPSize: 2, KVTimeout: 50 * time.Millisecond})
	null := startTest(t, Config{Mode: ModeNull, DPSize: 2})
	const missing = "Disaggregated request received without bootstrap room id"
	tests := []struct {
		name       string
		srv        *testServer
		path       string
		body       string
		wantStatus int
		wantBody   string // substring
	}{
		{"prefill chat without room", prefill, "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"hi"}],"bootstrap_host":"127.0.0.1"}`, 400,
			`{"code":400,"message":"` + missing + `","object":"error","param":null,"type":"BadRequestError"}`},
		{"decode generate without room", decode, "/generate",
			`{"text":"hi","bootstrap_host":"127.0.0.1"}`, 400, `{"error":{"message":"` + missing + `"}}`},
		{"decode responses without room", decode, "/v1/responses", `{"input":"hi"}`, 400, missing},
		{"null room", prefill, "/v1/completions", `{"prompt":"hi","bootstrap_room":null}`, 400, missing},
		{"batch with a null room", prefill, "/generate",
			`{"text":["a","b"],"bootstrap_room":[1,null]}`, 400, missing},
		{"batch room list too short", prefill, "/generate",
			`{"text":["a","b"],"bootstrap_room":[1]}`, 400, "bootstrap_room list has length 1 but the batch has 2 items"},
		{"batch host list too long", decode, "/v1/completions",
			`{"prompt":["a","b"],"bootstrap_room":[1,2],"bootstrap_host":["h","h","h"]}`, 400, "bootstrap_host list has length 3"},
		{"chat n=2 needs two rooms", prefill, "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"hi"}],"n":2,"bootstrap_room":[4]}`, 400, "bootstrap_room list has length 1"},
		{"scalar room on a batch", prefill, "/generate",
			`{"input_ids":[[1,2],[3]],"bootstrap_room":5}`, 400, "bootstrap_room must be a list of length 2"},
		{"non-integer room", prefill, "/generate", `{"text":"a","bootstrap_room":"x"}`, 400, "bootstrap_room"},
		{"null mode needs no room", null, "/generate", `{"text":"hi"}`, 200, `"text":"tok0`},
		{"malformed JSON", prefill, "/generate", `{"text":`, 400, "Invalid JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.srv.api.URL+tc.path, tc.body)
			if resp.status != tc.wantStatus || !strings.Contains(string(resp.body), tc.wantBody) {
				t.Fatalf("got %d %s, want %d containing %s", resp.status, resp.body, tc.wantStatus, tc.wantBody)
			}
			if rec := lastRecord(t, tc.srv.sim); rec.Status != tc.wantStatus {
				t.Fatalf("record status %d, want %d", rec.Status, tc.wantStatus)
			}
		})
	}
}

func TestPrefillConflict(t *testing.T) {
	conflict := func(rank, room, implied int) string {
		return fmt.Sprintf("follow_bootstrap_room conflict: dispatched to dp_rank %d but bootstrap_room %d implies dp_rank %d. "+
			"Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.", rank, room, implied)
	}
	tests := []struct {
		name      string
		dp        int
		path      string
		body      string
		headers   []string
		room      int64
		wantCode  int
		wantErr   string
		wantState string
		wantRank  int
	}{
		{name: "header rank disagrees with room", dp: 4, path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hi"}],"bootstrap_room":6}`, headers: []string{"X-Data-Parallel-Rank", "1"},
			room: 6, wantCode: 500, wantErr: conflict(1, 6, 2), wantState: RoomFailed, wantRank: 1},
		{name: "body rank disagrees with room", dp: 4, path: "/generate",
			body: `{"text":"hi","bootstrap_room":7,"routed_dp_rank":0}`,
			room: 7, wantCode: 500, wantErr: conflict(0, 7, 3), wantState: RoomFailed, wantRank: 0},
		{name: "disagg_prefill_dp_rank skips the check", dp: 4, path: "/generate",
			body: `{"text":"hi","bootstrap_room":8,"routed_dp_rank":3,"disagg_prefill_dp_rank":3}`,
			room: 8, wantCode: 200, wantState: RoomDone, wantRank: 3},
		{name: "pinned rank equal to room residue", dp: 4, path: "/generate",
			body: `{"text":"hi","bootstrap_room":9,"routed_dp_rank":1}`,
			room: 9, wantCode: 200, wantState: RoomDone, wantRank: 1},
		{name: "room only", dp: 4, path: "/v1/completions",
			body: `{"prompt":"hi","bootstrap_room":10}`, room: 10, wantCode: 200, wantState: RoomDone, wantRank: 2},
		{name: "dp 1 never conflicts", dp: 1, path: "/generate",
			body: `{"text":"hi","bootstrap_room":11,"routed_dp_rank":0}`, room: 11, wantCode: 200, wantState: RoomDone, wantRank: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startTest(t, Config{Mode: ModePrefill, DPSize: tc.dp})
			resp := post(t, p.api.URL+tc.path, tc.body, tc.headers...)
			if resp.status != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", resp.status, tc.wantCode, resp.body)
			}
			if tc.wantErr != "" && !strings.Contains(string(resp.body), tc.wantErr) {
				t.Fatalf("body %s, want %q", resp.body, tc.wantErr)
			}
			var st RoomStatus
			get(t, fmt.Sprintf("%s/sim/kv?room=%d", p.boot.URL, tc.room)).json(t, &st)
			if st.State != tc.wantState || st.DPRank == nil || *st.DPRank != tc.wantRank {
				t.Fatalf("room status %+v (rank %v), want %s on rank %d", st, deref(st.DPRank), tc.wantState, tc.wantRank)
			}
			if tc.wantErr != "" && st.Error != tc.wantErr {
				t.Fatalf("room error %q, want %q", st.Error, tc.wantErr)
			}
		})
	}
}

func TestPrefillConflictStreaming(t *testing.T) {
	p := startTest(t, Config{Mode: ModePrefill, DPSize: 2})
	resp := post(t, p.api.URL+"/v1/completions", `{"prompt":"hi","stream":true,"bootstrap_room":3,"routed_dp_rank":0}`)
	if resp.status != 200 {
		t.Fatalf("status %d, want 200 (the stream started)", resp.status)
	}
	events := sseEvents(t, resp.body)
	if len(events) != 2 || !strings.Contains(events[0], "follow_bootstrap_room conflict") || events[1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
}

// With SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK (Config.
// ForceQueryPrefillDPRank) a prefill serves a pinned rank its room does not
// imply, and the decode finds the KV on that rank.
func TestForceQueryPrefillDPRank(t *testing.T) {
	p := startTest(t, Config{Mode: ModePrefill, DPSize: 4, ForceQueryPrefillDPRank: true})
	d := startTest(t, Config{Mode: ModeDecode, DPSize: 2, KVTimeout: 5 * time.Second, ForceQueryPrefillDPRank: true})
	host, port := p.bootHostPort(t)
	if r := post(t, p.api.URL+"/v1/chat/completions", pdBody(host, port, 6, ""), "X-Data-Parallel-Rank", "1"); r.status != 200 {
		t.Fatalf("prefill pinned to rank 1 with room 6 (implies 2): status %d: %s", r.status, r.body)
	}
	var st RoomStatus
	get(t, fmt.Sprintf("%s/sim/kv?room=6", p.boot.URL)).json(t, &st)
	if st.DPRank == nil || *st.DPRank != 1 {
		t.Fatalf("room 6 on rank %v, want 1", deref(st.DPRank))
	}
	if r := post(t, d.api.URL+"/v1/chat/completions", pdBody(host, port, 6, "")); r.status != 200 {
		t.Fatalf("decode status %d: %s", r.status, r.body)
	}
}

func TestDecodeResolvesPrefillRank(t *testing.T) {
	tests := []struct {
		name        string
		prefillDP   int
		prefillBody string // sent to prefill first
		decodeExtra string
		room        int64
		wantPrefill int
	}{
		{name: "room modulo prefill dp", prefillDP: 4, room: 6, wantPrefill: 2},
		{name: "room modulo, large room", prefillDP: 4, room: 9223372036854775807, wantPrefill: 3},
		{name: "disagg_prefill_dp_rank wins", prefillDP: 4, room: 6,
			prefillBody: `"routed_dp_rank":1,"disagg_prefill_dp_rank":1`,
			decodeExtra: `"disagg_prefill_dp_rank":1`, wantPrefill: 1},
		{name: "prefill dp 1", prefillDP: 1, room: 7, wantPrefill: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, d := startPD(t, tc.prefillDP, 2, 5*time.Second)
			host, port := p.bootHostPort(t)
			if r := post(t, p.api.URL+"/v1/chat/completions", pdBody(host, port, tc.room, tc.prefillBody)); r.status != 200 {
				t.Fatalf("prefill status %d: %s", r.status, r.body)
			}
			resp := post(t, d.api.URL+"/v1/chat/completions", pdBody(host, port, tc.room, tc.decodeExtra))
			if resp.status != 200 {
				t.Fatalf("decode status %d: %s", resp.status, resp.body)
			}
			rec := lastRecord(t, d.sim)
			if rec.PrefillDPRank == nil || *rec.PrefillDPRank != tc.wantPrefill {
				t.Fatalf("prefill_dp_rank %v, want %d", deref(rec.PrefillDPRank), tc.wantPrefill)
			}
			if got := resp.header.Get("X-Sim-Prefill-DP-Rank"); got != fmt.Sprint(tc.wantPrefill) {
				t.Fatalf("X-Sim-Prefill-DP-Rank %q, want %d", got, tc.wantPrefill)
			}
			var out struct {
				Choices []struct {
					Message struct{ Content string }
				}
			}
			resp.json(t, &out)
			if len(out.Choices) != 1 || out.Choices[0].Message.Content != "tok0 tok1 tok2" {
				t.Fatalf("decode output %s", resp.body)
			}
		})
	}
}

func TestDecodeFailures(t *testing.T) {
	closed := closedPort(t)
	tests := []struct {
		name string
		// prefill is sent (and must succeed) before the decode request.
		prefill    string
		decodePath string
		decode     func(host string, port int) string
		wantStatus int
		wantMsg    string // regexp
	}{
		{name: "prefill never arrives", decodePath: "/v1/chat/completions",
			decode:     func(h string, p int) string { return pdBody(h, p, 77, "") },
			wantStatus: 500, wantMsg: `"message":"Request 77 timed out after 0\.[1-9]s in KVPoll\.WaitingForInput","object":"error"`},
		{name: "prefill never arrives, generate shape", decodePath: "/generate",
			decode: func(h string, p int) string {
				return fmt.Sprintf(`{"text":"hi","bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":78}`, h, p)
			},
			wantStatus: 500, wantMsg: `^\{"error":\{"message":"Request 78 timed out after 0\.[1-9]s in KVPoll\.WaitingForInput"\}\}$`},
		{name: "room prefilled on another rank",
			prefill:    `{"text":"hi","bootstrap_room":5,"routed_dp_rank":0,"disagg_prefill_dp_rank":0}`,
			decodePath: "/v1/completions",
			decode: func(h string, p int) string {
				return fmt.Sprintf(`{"prompt":"hi","bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":5}`, h, p)
			},
			wantStatus: 500, wantMsg: `"Request 5 timed out after 0\.[1-9]s in KVPoll\.WaitingForInput"`},
		{name: "bootstrap server unreachable", decodePath: "/v1/chat/completions",
			decode:     func(h string, _ int) string { return pdBody(h, closed, 79, "") },
			wantStatus: 500, wantMsg: regexp.QuoteMeta(fmt.Sprintf("Could not fetch prefill parallel info from 127.0.0.1:%d after 3 attempts", closed))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, d := startPD(t, 2, 2, 100*time.Millisecond)
			host, port := p.bootHostPort(t)
			if tc.prefill != "" {
				if r := post(t, p.api.URL+"/generate", tc.prefill); r.status != 200 {
					t.Fatalf("prefill status %d: %s", r.status, r.body)
				}
			}
			resp := post(t, d.api.URL+tc.decodePath, tc.decode(host, port))
			re := regexp.MustCompile(tc.wantMsg)
			if resp.status != tc.wantStatus || !re.Match(resp.body) {
				t.Fatalf("got %d %s, want %d matching %s", resp.status, resp.body, tc.wantStatus, tc.wantMsg)
			}
			rec := lastRecord(t, d.sim)
			if rec.Status != tc.wantStatus || rec.Error == "" || !strings.Contains(string(resp.body), rec.Error) {
				t.Fatalf("record %d %q", rec.Status, rec.Error)
			}
			// The load of the failed request was released.
			for _, l := range d.sim.load.snapshot() {
				if l.running != 0 || l.transfer != 0 || l.usedTokens != 0 {
					t.Fatalf("load not released: %+v", l)
				}
			}
		})
	}
}

func TestDecodeStreamingTimeoutIsInStream(t *testing.T) {
	p, d := startPD(t, 2, 2, 50*time.Millisecond)
	host, port := p.bootHostPort(t)
	resp := post(t, d.api.URL+"/v1/chat/completions", pdBody(host, port, 91, `"stream":true`))
	if resp.status != 200 || resp.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %q, want a 200 event stream", resp.status, resp.header.Get("Content-Type"))
	}
	events := sseEvents(t, resp.body)
	if len(events) != 2 || events[1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var ev struct {
		Error struct {
			Message string
			Code    int
		}
	}
	if err := json.Unmarshal([]byte(events[0]), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Error.Code != 500 || !regexp.MustCompile(`^Request 91 timed out after 0\.\ds in KVPoll\.WaitingForInput$`).MatchString(ev.Error.Message) {
		t.Fatalf("error event %+v", ev)
	}
	if rec := lastRecord(t, d.sim); rec.Status != 200 || !strings.Contains(rec.Error, "timed out") {
		t.Fatalf("record %d %q", rec.Status, rec.Error)
	}
}

func TestDecodeWaitsForPrefill(t *testing.T) {
	p, d := startPD(t, 4, 2, 5*time.Second)
	host, port := p.bootHostPort(t)
	done := make(chan response, 1)
	go func() {
		done <- post(t, d.api.URL+"/v1/chat/completions", pdBody(host, port, 4001, `"routed_dp_rank":1`))
	}()
	// The decode item sits in the transfer queue on rank 1 until the KV arrives.
	eventually(t, "decode in transfer queue", func() bool { return d.sim.load.snapshot()[1].transfer == 1 })
	if r := post(t, p.api.URL+"/v1/chat/completions", pdBody(host, port, 4001, "")); r.status != 200 {
		t.Fatalf("prefill status %d: %s", r.status, r.body)
	}
	resp := <-done
	if resp.status != 200 || resp.header.Get("X-Sim-DP-Rank") != "1" || resp.header.Get("X-Sim-Prefill-DP-Rank") != "1" {
		t.Fatalf("decode %d %v %s", resp.status, resp.header, resp.body)
	}
	if rec := lastRecord(t, p.sim); *rec.DPRank != 1 || *rec.RankSource != string(sourceRoom) {
		t.Fatalf("prefill served on %d (%s), want 1 (room)", *rec.DPRank, *rec.RankSource)
	}
}

func TestDecodeNullPortAndFakeHost(t *testing.T) {
	p, d := startPD(t, 2, 1, 2*time.Second)
	host, _ := p.bootHostPort(t)
	// bootstrap_port null: decode uses its own --bootstrap-port, here the prefill's.
	if r := post(t, p.api.URL+"/v1/chat/completions", pdBody(host, nil, 12, "")); r.status != 200 {
		t.Fatalf("prefill %d %s", r.status, r.body)
	}
	if r := post(t, d.api.URL+"/v1/chat/completions", pdBody(host, nil, 12, "")); r.status != 200 {
		t.Fatalf("decode with null port: %d %s", r.status, r.body)
	}
	// FAKE_BOOTSTRAP_HOST (health_generate) skips the transfer.
	r := post(t, d.api.URL+"/generate", `{"input_ids":[0],"sampling_params":{"max_new_tokens":1},"bootstrap_host":"2.2.2.2","bootstrap_room":0}`)
	if r.status != 200 {
		t.Fatalf("fake bootstrap: %d %s", r.status, r.body)
	}
}

func TestPrefillAbortFailsDecodeTransfer(t *testing.T) {
	p := startTest(t, Config{Mode: ModePrefill, DPSize: 2, PrefillPer1KTokens: time.Hour})
	_, port := p.bootHostPort(t)
	d := startTest(t, Config{Mode: ModeDecode, DPSize: 2, BootstrapPort: port, KVTimeout: 5 * time.Second})
	host, _ := p.bootHostPort(t)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eventually(t, "prefill running", func() bool { return p.sim.load.snapshot()[1].running == 1 })
		cancel()
	}()
	postCtx(ctx, t, p.api.URL+"/v1/chat/completions", pdBody(host, port, 21, ""))
	eventually(t, "prefill record", func() bool { return len(p.sim.Records()) == 1 })
	if rec := lastRecord(t, p.sim); rec.Status != statusClientClosed {
		t.Fatalf("prefill record status %d, want 499", rec.Status)
	}
	if l := p.sim.load.snapshot()[1]; l.running != 0 || l.usedTokens != 0 {
		t.Fatalf("prefill load not released: %+v", l)
	}
	resp := post(t, d.api.URL+"/v1/chat/completions", pdBody(host, port, 21, `"routed_dp_rank":0`))
	want := "Decode transfer failed for request rank=0 bootstrap_room=21"
	if resp.status != 500 || !strings.Contains(string(resp.body), want) {
		t.Fatalf("got %d %s, want 500 %q", resp.status, resp.body, want)
	}
}

func TestDecodeClientDisconnect(t *testing.T) {
	p, d := startPD(t, 2, 2, time.Minute)
	host, port := p.bootHostPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eventually(t, "decode waiting", func() bool { return d.sim.load.snapshot()[0].transfer == 1 })
		cancel()
	}()
	postCtx(ctx, t, d.api.URL+"/v1/chat/completions", pdBody(host, port, 31, `"stream":true,"routed_dp_rank":0`))
	eventually(t, "decode record", func() bool { return len(d.sim.Records()) == 1 })
	if rec := lastRecord(t, d.sim); rec.Status != statusClientClosed {
		t.Fatalf("record status %d, want 499", rec.Status)
	}
	if l := d.sim.load.snapshot()[0]; l.transfer != 0 || l.usedTokens != 0 {
		t.Fatalf("load not released: %+v", l)
	}
}

// closedPort returns a loopback port nobody listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port
}

// With AwaitTransfer a prefill answers only once a decode took its KV, and
// one whose decode never comes fails after the bootstrap timeout (the KV
// timeout by default); a decode that preallocated (its bootstrap message)
// and polls the room as done releases it.
func TestAwaitTransfer(t *testing.T) {
	p := startTest(t, Config{Mode: ModePrefill, DPSize: 1, AwaitTransfer: true, KVTimeout: 300 * time.Millisecond})
	body := `{"text":"hi","sampling_params":{"max_new_tokens":1},"bootstrap_host":"127.0.0.1","bootstrap_room":%d}`

	start := time.Now()
	if r := post(t, p.api.URL+"/generate", fmt.Sprintf(body, 11)); r.status != 500 || time.Since(start) < 250*time.Millisecond ||
		!strings.Contains(string(r.body), "Prefill bootstrap failed for request rank=0 bootstrap_room=11 with exception KVTransferError") ||
		!strings.Contains(string(r.body), "in KVPoll.Bootstrapping") {
		t.Fatalf("no decode: status %d after %v, want 500 after the bootstrap timeout: %s", r.status, time.Since(start), r.body)
	}

	done := make(chan int, 1)
	go func() { done <- post(t, p.api.URL+"/generate", fmt.Sprintf(body, 12)).status }()
	select {
	case code := <-done:
		t.Fatalf("prefill answered %d before any decode took the KV", code)
	case <-time.After(100 * time.Millisecond):
	}
	if r := post(t, p.boot.URL+"/sim/kv_prefix", `{"room":12,"decode_prefix_len":0}`); r.status != 200 {
		t.Fatalf("bootstrap message: %d %s", r.status, r.body)
	}
	kv, err := http.Get(p.boot.URL + "/sim/kv?room=12&wait_ms=1000")
	if err != nil {
		t.Fatal(err)
	}
	kv.Body.Close()
	if code := <-done; code != 200 {
		t.Fatalf("after the decode took the KV: status %d, want 200", code)
	}
}
