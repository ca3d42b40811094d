package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// hex32 matches a uuid4().hex rid.
var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// abortRID posts an /abort_request and checks SGLang's answer: 200 with an
// empty body, whatever happened.
func abortRID(t *testing.T, ts *testServer, body string) {
	t.Helper()
	r := post(t, ts.api.URL+"/abort_request", body)
	if r.status != 200 || len(r.body) != 0 {
		t.Fatalf("abort_request %s: %d %q, want 200 and an empty body", body, r.status, r.body)
	}
}

// inFlight returns the in-flight item with rid, or false.
func inFlight(s *Server, rid string) (InFlightItem, bool) {
	for _, it := range s.Stats().InFlight {
		if it.RID == rid {
			return it, true
		}
	}
	return InFlightItem{}, false
}

// waitStage waits until item rid is in flight at stage.
func waitStage(t *testing.T, s *Server, rid, stage string) {
	t.Helper()
	eventually(t, rid+" at stage "+stage, func() bool {
		it, ok := inFlight(s, rid)
		return ok && it.Stage == stage
	})
}

// background posts body to url in a goroutine, bounded by 10 s.
func background(t *testing.T, url, body string) <-chan response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	out := make(chan response, 1)
	go func() {
		defer cancel()
		out <- postCtx(ctx, t, url, body)
	}()
	return out
}

// await returns the response of a background request.
func await(t *testing.T, ch <-chan response) response {
	t.Helper()
	select {
	case r := <-ch:
		if r.status == 0 {
			t.Fatal("background request got no response")
		}
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("background request did not end")
	}
	return response{}
}

// idle checks, eventually, that the server holds no load: every rank's
// KV and request slots were freed (simple or engine model).
func idle(t *testing.T, s *Server) {
	t.Helper()
	eventually(t, "KV and load freed", func() bool {
		for _, l := range s.snapshot() {
			if l.running != 0 || l.waiting != 0 || l.bootstrap != 0 || l.transfer != 0 || l.usedTokens != 0 {
				return false
			}
		}
		return len(s.Stats().InFlight) == 0
	})
}

// pdChat is a PD chat body with a rid and max_tokens.
func pdChat(host string, port int, room int64, rid string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"messages": []any{map[string]string{"role": "user", "content": "hello there"}}, "max_tokens": maxTokens,
		"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room, "rid": rid, "stream": stream,
	})
	return string(b)
}

// lastData returns the last SSE payload before [DONE].
func lastData(t *testing.T, body []byte) string {
	t.Helper()
	ev := sseEvents(t, body)
	if len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", ev)
	}
	return ev[len(ev)-2]
}

func TestRIDFromBody(t *testing.T) {
	ts := startTest(t, Config{})
	const mismatch = "The specified rids length mismatch with the batch_size for batch processing."
	tests := []struct {
		name     string
		path     string
		body     string
		status   int
		wantRIDs []string // nil: random 32-hex rids
		nRIDs    int
		wantID   string // response id (OpenAI) or meta_info.id (/generate, first item); "" skips
		wantBody string // substring of the error body
	}{
		{name: "generate single", path: "/generate", body: `{"text":"hi","rid":"g1"}`, status: 200,
			wantRIDs: []string{"g1"}, wantID: "g1"},
		{name: "generate single, list of one", path: "/generate", body: `{"text":"hi","rid":["g2"]}`, status: 200,
			wantRIDs: []string{"g2"}, wantID: "g2"},
		{name: "generate without rid", path: "/generate", body: `{"text":"hi"}`, status: 200, nRIDs: 1},
		{name: "generate text batch, string rid", path: "/generate", body: `{"text":["a","b","c"],"rid":"b"}`, status: 200,
			wantRIDs: []string{"b_0", "b_1", "b_2"}, wantID: "b_0"},
		{name: "generate ids batch, rid list", path: "/generate", body: `{"input_ids":[[1],[2]],"rid":["x","y"]}`, status: 200,
			wantRIDs: []string{"x", "y"}, wantID: "x"},
		{name: "generate batch without rid", path: "/generate", body: `{"text":["a","b"]}`, status: 200, nRIDs: 2},
		{name: "generate batch, rid list too short", path: "/generate", body: `{"text":["a","b"],"rid":["x"]}`, status: 400,
			wantBody: `{"error":{"message":"` + mismatch + `"}}`},
		{name: "generate single, list of two", path: "/generate", body: `{"text":"a","rid":["x","y"]}`, status: 400,
			wantBody: mismatch},
		{name: "generate batch, duplicate rids", path: "/generate", body: `{"text":["a","b"],"rid":["x","x"]}`, status: 400,
			wantBody: "Duplicate request IDs detected within the request: ['x']"},
		{name: "generate, rid not a string", path: "/generate", body: `{"text":"a","rid":7}`, status: 400, wantBody: "rid"},
		{name: "completions single", path: "/v1/completions", body: `{"prompt":"hi","rid":"c1"}`, status: 200,
			wantRIDs: []string{"c1"}, wantID: "c1"},
		{name: "completions batch, string rid", path: "/v1/completions", body: `{"prompt":["a","b"],"rid":"cb"}`, status: 200,
			wantRIDs: []string{"cb_0", "cb_1"}, wantID: "cb_0"},
		{name: "completions batch, rid list mismatch", path: "/v1/completions", body: `{"prompt":["a","b"],"rid":["x","y","z"]}`,
			status: 400, wantBody: `"message":"` + mismatch + `","object":"error"`},
		{name: "chat", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hi"}],"rid":"chat-1"}`,
			status: 200, wantRIDs: []string{"chat-1"}, wantID: "chat-1"},
		{name: "chat without rid", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hi"}]}`,
			status: 200, nRIDs: 1},
		{name: "chat n=3 ignores the rid", path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hi"}],"n":3,"rid":"mine"}`, status: 200, nRIDs: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, ts.api.URL+tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.status != 200 {
				if !strings.Contains(string(r.body), tc.wantBody) {
					t.Fatalf("body %s, want %s", r.body, tc.wantBody)
				}
				return
			}
			rec := lastRecord(t, ts.sim)
			if tc.wantRIDs != nil && !slices.Equal(rec.RIDs, tc.wantRIDs) {
				t.Fatalf("record rids %q, want %q", rec.RIDs, tc.wantRIDs)
			}
			if tc.wantRIDs == nil {
				if len(rec.RIDs) != tc.nRIDs {
					t.Fatalf("record rids %q, want %d", rec.RIDs, tc.nRIDs)
				}
				for _, rid := range rec.RIDs {
					if !hex32.MatchString(rid) {
						t.Fatalf("rid %q is not a 32-hex uuid", rid)
					}
				}
				if len(rec.RIDs) > 1 && rec.RIDs[0] == rec.RIDs[1] {
					t.Fatalf("rids repeat: %q", rec.RIDs)
				}
			}
			var id string
			if tc.path == "/generate" {
				var one struct {
					MetaInfo struct{ ID string } `json:"meta_info"`
				}
				var many []struct {
					MetaInfo struct{ ID string } `json:"meta_info"`
				}
				if json.Unmarshal(r.body, &many) == nil {
					for i, m := range many {
						if m.MetaInfo.ID != rec.RIDs[i] {
							t.Fatalf("item %d meta_info.id %q, want %q", i, m.MetaInfo.ID, rec.RIDs[i])
						}
					}
					id = many[0].MetaInfo.ID
				} else {
					r.json(t, &one)
					id = one.MetaInfo.ID
				}
			} else {
				var o struct{ ID string }
				r.json(t, &o)
				id = o.ID
			}
			want := tc.wantID
			if want == "" {
				want = rec.RIDs[0]
			}
			if id != want {
				t.Fatalf("response id %q, want %q", id, want)
			}
		})
	}
}

func TestStreamingChunkIDsAreRIDs(t *testing.T) {
	ts := startTest(t, Config{})
	r := post(t, ts.api.URL+"/v1/completions", `{"prompt":["a","b"],"rid":"s","max_tokens":2,"stream":true}`)
	seen := map[int]string{}
	for _, ev := range sseEvents(t, r.body) {
		if ev == "[DONE]" {
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		var id struct{ ID string }
		_ = json.Unmarshal([]byte(ev), &id)
		for _, ch := range c.Choices {
			seen[ch.Index] = id.ID
		}
	}
	if seen[0] != "s_0" || seen[1] != "s_1" {
		t.Fatalf("chunk ids by choice %v, want s_0 and s_1", seen)
	}
}

func TestDuplicateRIDRejected(t *testing.T) {
	tests := []struct {
		path, long, dup, want string
	}{
		{"/generate", `{"text":"hi","rid":"dup","sampling_params":{"max_new_tokens":100000}}`,
			`{"text":"x","rid":"dup"}`, `{"error":{"message":"Duplicate request ID detected: dup"}}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"rid":"dup","max_tokens":100000}`,
			`{"messages":[{"role":"user","content":"x"}],"rid":"dup"}`,
			`{"code":400,"message":"Duplicate request ID detected: dup","object":"error","param":null,"type":"BadRequestError"}`},
		{"/v1/completions", `{"prompt":"hi","rid":"dup","max_tokens":100000}`,
			`{"prompt":["x","y"],"rid":["other","dup"]}`, `"message":"Duplicate request ID detected: dup"`},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			ts := startTest(t, Config{DecodePerToken: 10 * time.Millisecond})
			first := background(t, ts.api.URL+tc.path, tc.long)
			waitStage(t, ts.sim, "dup", "running")
			r := post(t, ts.api.URL+tc.path, tc.dup)
			if r.status != 400 || !strings.Contains(string(r.body), tc.want) {
				t.Fatalf("duplicate: %d %s, want 400 %s", r.status, r.body, tc.want)
			}
			if _, ok := inFlight(ts.sim, "other"); ok {
				t.Fatal("a rejected batch left an item in flight")
			}
			// The first request is untouched; once it ended the rid is free.
			abortRID(t, ts, `{"rid":"dup"}`)
			if r := await(t, first); r.status != 200 {
				t.Fatalf("first request: %d %s", r.status, r.body)
			}
			if r := post(t, ts.api.URL+tc.path, strings.ReplaceAll(tc.long, "100000", "2")); r.status != 200 {
				t.Fatalf("rid reused after the end: %d %s", r.status, r.body)
			}
		})
	}
}

func TestAbortDecodeWaitingForKV(t *testing.T) {
	for _, profile := range []string{"", "dense-8b-h100"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("profile=%q/stream=%v", profile, stream), func(t *testing.T) {
				p := startTest(t, Config{Mode: ModePrefill})
				host, port := p.bootHostPort(t)
				d := startTest(t, Config{Mode: ModeDecode, Profile: profile, BootstrapPort: port, KVTimeout: time.Minute})
				ch := background(t, d.api.URL+"/v1/chat/completions", pdChat(host, port, 41, "dec-1", 10, stream))
				waitStage(t, d.sim, "dec-1", "waiting_kv")
				abortRID(t, d, `{"rid":"dec-1","abort_all":false}`)
				r := await(t, ch)
				const want = "Decode transfer failed for request rank=0 bootstrap_room=41 with exception Aborted by AbortReq."
				if !stream {
					if r.status != 500 || !strings.Contains(string(r.body), `"message":"`+want+`"`) ||
						!strings.Contains(string(r.body), `"code":500`) {
						t.Fatalf("got %d %s, want 500 %q", r.status, r.body, want)
					}
				} else {
					var ev struct {
						Error struct {
							Message string
							Code    int
						}
					}
					if r.status != 200 {
						t.Fatalf("stream status %d", r.status)
					}
					if err := json.Unmarshal([]byte(lastData(t, r.body)), &ev); err != nil || ev.Error.Message != want || ev.Error.Code != 500 {
						t.Fatalf("stream %q, want the error event %q", r.body, want)
					}
				}
				rec := lastRecord(t, d.sim)
				if !rec.Aborted || !slices.Equal(rec.AbortedRIDs, []string{"dec-1"}) || rec.Error != want ||
					!slices.Equal(rec.FinishReasons, []string{""}) {
					t.Fatalf("record %+v", rec)
				}
				if st := d.sim.Stats(); st.Aborted != 1 || st.AbortRequests != 1 {
					t.Fatalf("stats %+v", st)
				}
				if m := get(t, d.api.URL+"/metrics"); !strings.Contains(string(m.body), `sglang:num_aborted_requests_total{model_name="sim-model"} 1`) {
					t.Fatalf("metrics lack the abort counter:\n%s", m.body)
				}
				idle(t, d.sim)
			})
		}
	}
}

// generateResult is a /generate body or final stream event.
type generateResult struct {
	Text     string `json:"text"`
	MetaInfo struct {
		ID               string `json:"id"`
		CompletionTokens int    `json:"completion_tokens"`
		FinishReason     *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Length  int    `json:"length"`
		} `json:"finish_reason"`
	} `json:"meta_info"`
}

func TestAbortRunningItem(t *testing.T) {
	type outcome struct {
		finish string // finish_reason (OpenAI) or finish_reason.type (/generate)
		msg    string // /generate finish_reason.message
		tokens int
	}
	parse := func(t *testing.T, path string, stream bool, r response) outcome {
		t.Helper()
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		data := string(r.body)
		if stream {
			data = lastData(t, r.body)
		}
		if path == "/generate" {
			var g generateResult
			if err := json.Unmarshal([]byte(data), &g); err != nil || g.MetaInfo.FinishReason == nil {
				t.Fatalf("generate result %s", data)
			}
			return outcome{g.MetaInfo.FinishReason.Type, g.MetaInfo.FinishReason.Message, g.MetaInfo.CompletionTokens}
		}
		var c struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
				Message      struct{ Content string }
			}
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].FinishReason == nil {
			t.Fatalf("chat result %s", data)
		}
		n := c.Usage.CompletionTokens
		if !stream && strings.Count(c.Choices[0].Message.Content, "tok") != n {
			t.Fatalf("content %q does not hold %d tokens", c.Choices[0].Message.Content, n)
		}
		return outcome{finish: *c.Choices[0].FinishReason, tokens: n}
	}
	const maxTokens = 100000
	for _, mode := range []Mode{ModeNull, ModeDecode} {
		for _, profile := range []string{"", "dense-8b-h100"} {
			for _, path := range []string{"/v1/chat/completions", "/generate"} {
				for _, stream := range []bool{false, true} {
					name := fmt.Sprintf("%s/profile=%q%s/stream=%v", mode, profile, path, stream)
					t.Run(name, func(t *testing.T) {
						cfg := Config{Mode: mode, Profile: profile, DecodePerToken: 5 * time.Millisecond, KVTimeout: time.Minute}
						var bootstrap map[string]any
						var p *testServer
						if mode == ModeDecode {
							p = startTest(t, Config{Mode: ModePrefill})
							host, port := p.bootHostPort(t)
							cfg.BootstrapPort = port
							bootstrap = map[string]any{"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 7}
						}
						ts := startTest(t, cfg)
						body := map[string]any{"rid": "run-1", "stream": stream}
						if path == "/generate" {
							body["text"] = "hello"
							body["sampling_params"] = map[string]any{"max_new_tokens": maxTokens}
						} else {
							body["messages"] = []any{map[string]string{"role": "user", "content": "hello"}}
							body["max_tokens"] = maxTokens
						}
						for k, v := range bootstrap {
							body[k] = v
						}
						b, _ := json.Marshal(body)
						ch := background(t, ts.api.URL+path, string(b))
						if p != nil {
							pb, _ := json.Marshal(map[string]any{"text": "hello", "bootstrap_room": 7})
							if r := post(t, p.api.URL+"/generate", string(pb)); r.status != 200 {
								t.Fatalf("prefill %d %s", r.status, r.body)
							}
						}
						waitStage(t, ts.sim, "run-1", "running")
						time.Sleep(30 * time.Millisecond) // a few tokens
						abortRID(t, ts, `{"rid":"run-1"}`)
						got := parse(t, path, stream, await(t, ch))
						if got.finish != "abort" || got.tokens >= maxTokens {
							t.Fatalf("outcome %+v, want finish_reason abort with partial output", got)
						}
						if path == "/generate" && got.msg != "Aborted" {
							t.Fatalf("finish_reason.message %q, want Aborted", got.msg)
						}
						rec := lastRecord(t, ts.sim)
						if rec.Status != 200 || rec.Error != "" || !rec.Aborted || !slices.Equal(rec.FinishReasons, []string{"abort"}) {
							t.Fatalf("record %+v", rec)
						}
						idle(t, ts.sim)
					})
				}
			}
		}
	}
}

func TestAbortBatchItemsByExactRID(t *testing.T) {
	ts := startTest(t, Config{DecodePerToken: 5 * time.Millisecond})
	long := `{"max_new_tokens":100000}`
	ch := background(t, ts.api.URL+"/generate",
		`{"text":["a","b","c"],"rid":"bt","sampling_params":[{"max_new_tokens":2},`+long+`,`+long+`]}`)
	waitStage(t, ts.sim, "bt_1", "running")
	waitStage(t, ts.sim, "bt_2", "running")
	// The base rid is not in flight: the tokenizer drops the abort.
	abortRID(t, ts, `{"rid":"bt"}`)
	// An empty rid without abort_all is ignored too.
	abortRID(t, ts, `{"rid":""}`)
	abortRID(t, ts, `{}`)
	time.Sleep(20 * time.Millisecond)
	if it, ok := inFlight(ts.sim, "bt_1"); !ok || it.Aborted {
		t.Fatalf("bt_1 after aborting the base rid: %+v %v", it, ok)
	}
	if st := ts.sim.Stats(); st.Aborted != 0 || st.AbortRequests != 3 {
		t.Fatalf("stats %+v", st)
	}
	abortRID(t, ts, `{"rid":"bt_1"}`)
	if it, ok := inFlight(ts.sim, "bt_2"); !ok || it.Aborted {
		t.Fatalf("bt_2 after aborting bt_1: %+v %v", it, ok)
	}
	abortRID(t, ts, `{"rid":"bt_2"}`)
	r := await(t, ch)
	var out []generateResult
	r.json(t, &out)
	if len(out) != 3 {
		t.Fatalf("results %s", r.body)
	}
	for i, want := range []string{"length", "abort", "abort"} {
		if fr := out[i].MetaInfo.FinishReason; fr == nil || fr.Type != want || out[i].MetaInfo.ID != fmt.Sprintf("bt_%d", i) {
			t.Fatalf("item %d: %+v, want finish %s", i, out[i].MetaInfo, want)
		}
	}
	rec := lastRecord(t, ts.sim)
	if !slices.Equal(rec.FinishReasons, []string{"length", "abort", "abort"}) || !slices.Equal(rec.AbortedRIDs, []string{"bt_1", "bt_2"}) {
		t.Fatalf("record %+v", rec)
	}
}

func TestAbortMatchesByPrefix(t *testing.T) {
	ts := startTest(t, Config{DecodePerToken: 5 * time.Millisecond})
	ch := background(t, ts.api.URL+"/generate",
		`{"text":["a","b","c"],"rid":["x_1","x_10","x_2"],"sampling_params":{"max_new_tokens":100000}}`)
	waitStage(t, ts.sim, "x_2", "running")
	// x_1 exists, so the scheduler aborts every rid starting with it.
	abortRID(t, ts, `{"rid":"x_1"}`)
	if st := ts.sim.Stats(); st.Aborted != 2 {
		t.Fatalf("aborting x_1 hit %d items, want x_1 and x_10", st.Aborted)
	}
	if it, ok := inFlight(ts.sim, "x_2"); !ok || it.Aborted {
		t.Fatalf("x_2: %+v %v", it, ok)
	}
	abortRID(t, ts, `{"rid":"x_2"}`)
	await(t, ch)
	if rec := lastRecord(t, ts.sim); !slices.Equal(rec.AbortedRIDs, []string{"x_1", "x_10", "x_2"}) {
		t.Fatalf("record %+v", rec)
	}
}

func TestAbortAll(t *testing.T) {
	ts := startTest(t, Config{DecodePerToken: 5 * time.Millisecond})
	a := background(t, ts.api.URL+"/v1/completions", `{"prompt":"a","rid":"one","max_tokens":100000}`)
	b := background(t, ts.api.URL+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"b"}],"rid":"two","max_tokens":100000,"stream":true}`)
	waitStage(t, ts.sim, "one", "running")
	waitStage(t, ts.sim, "two", "running")
	abortRID(t, ts, `{"abort_all":true}`)
	if r := await(t, a); r.status != 200 || !strings.Contains(string(r.body), `"finish_reason":"abort"`) {
		t.Fatalf("one: %d %s", r.status, r.body)
	}
	if r := await(t, b); r.status != 200 || !strings.Contains(lastData(t, r.body), `"finish_reason":"abort"`) {
		t.Fatalf("two: %d %s", r.status, r.body)
	}
	if st := ts.sim.Stats(); st.Aborted != 2 {
		t.Fatalf("stats %+v", st)
	}
	idle(t, ts.sim)
}

func TestAbortUnknownRID(t *testing.T) {
	ts := startTest(t, Config{DecodePerToken: 20 * time.Millisecond})
	ch := background(t, ts.api.URL+"/generate", `{"text":"a","rid":"known","sampling_params":{"max_new_tokens":5}}`)
	waitStage(t, ts.sim, "known", "running")
	// Unknown, and a prefix of a rid in flight: both dropped at the tokenizer.
	abortRID(t, ts, `{"rid":"nope"}`)
	abortRID(t, ts, `{"rid":"kno"}`)
	r := await(t, ch)
	var g generateResult
	r.json(t, &g)
	if r.status != 200 || g.MetaInfo.FinishReason == nil || g.MetaInfo.FinishReason.Type != "length" || g.MetaInfo.CompletionTokens != 5 {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if rec := lastRecord(t, ts.sim); rec.Aborted {
		t.Fatalf("record %+v", rec)
	}
	if st := ts.sim.Stats(); st.Aborted != 0 || st.AbortRequests != 2 {
		t.Fatalf("stats %+v", st)
	}
	// A malformed body is FastAPI's validation error.
	if r := post(t, ts.api.URL+"/abort_request", `{"rid":5}`); r.status != 422 {
		t.Fatalf("malformed abort: %d %s", r.status, r.body)
	}
}

func TestAbortPrefillFailsRoomAndDecode(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"simple model", Config{Mode: ModePrefill, PrefillPer1KTokens: time.Hour}},
		// Model time 10^4 times slower than wall time: the prefill never ends.
		{"engine model", Config{Mode: ModePrefill, Profile: "dense-8b-h100", TimeScale: 1e-4}},
	}
	for _, tc := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				p := startTest(t, tc.cfg)
				host, port := p.bootHostPort(t)
				d := startTest(t, Config{Mode: ModeDecode, BootstrapPort: port, KVTimeout: time.Minute})
				pch := background(t, p.api.URL+"/v1/chat/completions", pdChat(host, port, 55, "pf", 4, stream))
				dch := background(t, d.api.URL+"/v1/chat/completions", pdChat(host, port, 55, "dc", 4, false))
				waitStage(t, p.sim, "pf", "prefill")
				waitStage(t, d.sim, "dc", "waiting_kv")
				abortRID(t, p, `{"rid":"pf"}`)

				const want = "Prefill bootstrap failed for request rank=0 bootstrap_room=55 with exception Aborted by AbortReq."
				r := await(t, pch)
				if stream {
					if r.status != 200 || !strings.Contains(lastData(t, r.body), want) {
						t.Fatalf("prefill stream %d %s", r.status, r.body)
					}
				} else if r.status != 500 || !strings.Contains(string(r.body), want) {
					t.Fatalf("prefill %d %s, want 500 %q", r.status, r.body, want)
				}
				var st RoomStatus
				get(t, p.boot.URL+"/sim/kv?room=55").json(t, &st)
				if st.State != RoomFailed || st.Error != "Aborted by AbortReq." {
					t.Fatalf("room %+v", st)
				}
				dr := await(t, dch)
				if dr.status != 500 || !strings.Contains(string(dr.body), "Decode transfer failed for request rank=0 bootstrap_room=55") {
					t.Fatalf("decode %d %s", dr.status, dr.body)
				}
				if rec := lastRecord(t, d.sim); rec.Aborted {
					t.Fatal("the decode was not aborted itself")
				}
				if rec := lastRecord(t, p.sim); !rec.Aborted || rec.Error != want {
					t.Fatalf("prefill record %+v", rec)
				}
				idle(t, p.sim)
				idle(t, d.sim)
			})
		}
	}
}

func TestAbortRequestVLLMNotFound(t *testing.T) {
	ts := startTest(t, Config{Flavor: FlavorVLLM})
	if r := post(t, ts.api.URL+"/abort_request", `{"rid":"x"}`); r.status != 404 {
		t.Fatalf("vllm /abort_request: %d", r.status)
	}
}
