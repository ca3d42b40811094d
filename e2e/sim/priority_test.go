package sim

import (
	"cmp"
	"encoding/json"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestServerInfoPriorityArgs(t *testing.T) {
	tests := []struct {
		name                   string
		cfg                    Config
		path                   string
		enable, lowFirst, abrt bool
	}{
		{name: "defaults", cfg: Config{}, path: "/server_info"},
		{name: "enabled", cfg: Config{EnablePriorityScheduling: true}, path: "/server_info", enable: true},
		{name: "low values first", cfg: Config{EnablePriorityScheduling: true, ScheduleLowPriorityValuesFirst: true},
			path: "/server_info", enable: true, lowFirst: true},
		{name: "abort when disabled", cfg: Config{AbortOnPriorityWhenDisabled: true}, path: "/server_info", abrt: true},
		{name: "deprecated alias", cfg: Config{EnablePriorityScheduling: true, ScheduleLowPriorityValuesFirst: true},
			path: "/get_server_info", enable: true, lowFirst: true},
		{name: "engine model decode", cfg: Config{Mode: ModeDecode, Profile: "dense-8b-h100", EnablePriorityScheduling: true},
			path: "/server_info", enable: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startTest(t, tc.cfg)
			r := get(t, ts.api.URL+tc.path)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var info map[string]any
			r.json(t, &info)
			want := map[string]any{"enable_priority_scheduling": tc.enable, "schedule_low_priority_values_first": tc.lowFirst,
				"abort_on_priority_when_disabled": tc.abrt}
			for k, v := range want {
				if info[k] != v {
					t.Errorf("%s = %v (%T), want %v", k, info[k], info[k], v)
				}
			}
		})
	}
	t.Run("model", func(t *testing.T) {
		m, err := NewModel(Config{Profile: "dense-8b-h100", EnablePriorityScheduling: true, ScheduleLowPriorityValuesFirst: true})
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.ServerInfoJSON()
		if err != nil {
			t.Fatal(err)
		}
		var info map[string]any
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatal(err)
		}
		if info["enable_priority_scheduling"] != true || info["schedule_low_priority_values_first"] != true {
			t.Fatalf("model server info %s", b)
		}
	})
}

func TestPriorityFlagsNeedSGLangFlavor(t *testing.T) {
	_, err := New(Config{Flavor: FlavorVLLM, EnablePriorityScheduling: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "priority scheduling flags") {
		t.Fatalf("New: %v, want the priority flags refused for vllm", err)
	}
}

// modelOrderBody is a /generate body for the order tests: a prompt of 96
// token ids of its own, and the priority field when prio is not "".
func modelOrderBody(i int, prio string) []byte {
	ids := make([]string, 96)
	for k := range ids {
		ids[k] = strconv.Itoa(i*1000 + k)
	}
	b := `{"input_ids":[` + strings.Join(ids, ",") + `],"sampling_params":{"max_new_tokens":4}`
	if prio != "" {
		b += `,"priority":` + prio
	}
	return []byte(b + "}")
}

// runModel runs m until every item is done, delivering a decode's KV to
// every item that waits for it.
func runModel(t *testing.T, m *Model, items []*Item) {
	t.Helper()
	for range 100 {
		done := true
		for _, it := range items {
			if it.State() == ItemTransfer {
				m.KVArrived(m.core.now, it)
			}
			done = done && it.State() == ItemDone
		}
		if done {
			return
		}
		for {
			at, ok := m.NextEvent()
			if !ok {
				break
			}
			m.Advance(at)
		}
	}
	t.Fatal("the items never finished")
}

// TestPriorityOrdersWaitingQueue queues requests behind a blocker on a
// rank with one request slot and checks the order in which they are
// admitted: first come first served without priority scheduling (the
// field then ignored), else by priority, larger or smaller values first,
// first come first served among equals, a request without priority last.
// A decode orders its prealloc queue the same way.
func TestPriorityOrdersWaitingQueue(t *testing.T) {
	queued := []struct{ name, prio string }{{"a", "5"}, {"none", ""}, {"c", "10"}, {"d", "5"}, {"e", "-3"}}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "off", cfg: Config{}, want: "a none c d e"},
		{name: "off, low values first alone", cfg: Config{ScheduleLowPriorityValuesFirst: true}, want: "a none c d e"},
		{name: "large values first", cfg: Config{EnablePriorityScheduling: true}, want: "c a d e none"},
		{name: "low values first", cfg: Config{EnablePriorityScheduling: true, ScheduleLowPriorityValuesFirst: true}, want: "e a d c none"},
	}
	for _, mode := range []Mode{ModeNull, ModeDecode} {
		for _, tc := range tests {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				cfg := tc.cfg
				cfg.Profile, cfg.Mode, cfg.DPSize, cfg.MaxRunningRequests = "dense-8b-h100", mode, 1, 1
				m, err := NewModel(cfg)
				if err != nil {
					t.Fatal(err)
				}
				var items []*Item
				submit := func(at time.Duration, i int, name, prio string) {
					t.Helper()
					p, err := ParsePrompt("/generate", modelOrderBody(i, prio), m.core.p.prof.BlockSize)
					if err != nil {
						t.Fatal(err)
					}
					it, err := m.Submit(at, 0, p, p.MaxTokens)
					if err != nil {
						t.Fatal(err)
					}
					it.Tag = name
					items = append(items, it)
				}
				submit(0, 0, "blocker", "")
				m.Advance(0) // admitted before the others arrive
				for i, q := range queued {
					submit(time.Millisecond, i+1, q.name, q.prio)
				}
				runModel(t, m, items)
				slices.SortStableFunc(items, func(a, b *Item) int { return cmp.Compare(a.AdmittedAt(), b.AdmittedAt()) })
				var order []string
				for _, it := range items {
					order = append(order, it.Tag.(string))
				}
				if got := strings.Join(order[1:], " "); order[0] != "blocker" || got != tc.want {
					t.Fatalf("admitted %v, want blocker then %s", order, tc.want)
				}
			})
		}
	}
}

// TestPriorityWaitsOnlyForArrivedRequests checks that a request queued
// ahead for its priority but not arrived yet (the loop submits at the
// clock's time while the model still processes earlier steps) neither
// blocks the arrived ones nor is forgotten: it starts when it arrives.
func TestPriorityWaitsOnlyForArrivedRequests(t *testing.T) {
	c := testCore(t, "dense-8b-h100", ModeNull, 1, false, func(p *engineParams) {
		p.maxRunning = 1
		p.order = priorityOrder{enabled: true}
	})
	blocker := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 100, maxNew: 4, priority: math.MinInt64}, 0)
	c.advance(0)
	low := mustSubmit(t, c, requestSpec{kind: kindUnified, prompt: 100, maxNew: 4, priority: 1}, 0)
	high, err := c.submit(requestSpec{kind: kindUnified, prompt: 100, maxNew: 4, priority: 9}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.ranks[0].waiting[0] != high {
		t.Fatal("the high-priority request is not queued first")
	}
	c.runUntilIdle()
	if !(low.admittedAt >= blocker.doneAt && low.admittedAt < time.Second) {
		t.Fatalf("low admitted at %v (blocker done at %v): want it to start after the blocker, not wait for high's arrival",
			low.admittedAt, blocker.doneAt)
	}
	if high.admittedAt != 10*time.Second || high.state != stDone {
		t.Fatalf("high admitted at %v in state %v: want it started on arrival, at 10s", high.admittedAt, high.state)
	}
}

func TestPriorityEffective(t *testing.T) {
	five := int64(5)
	tests := []struct {
		name  string
		order priorityOrder
		p     *int64
		want  int64
	}{
		{"off", priorityOrder{}, &five, 0},
		{"given", priorityOrder{enabled: true}, &five, 5},
		{"none, large values first", priorityOrder{enabled: true}, nil, math.MinInt64},
		{"none, low values first", priorityOrder{enabled: true, lowFirst: true}, nil, math.MaxInt64},
	}
	for _, tc := range tests {
		if got := tc.order.effective(tc.p); got != tc.want {
			t.Errorf("%s: effective %d, want %d", tc.name, got, tc.want)
		}
	}
}

// errResp is SGLang's OpenAI ErrorResponse, as JSON decodes it.
func errResp(msg, typ string, code int) map[string]any {
	return map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": float64(code)}
}

// abortOutput is the stream event of a /generate item aborted for its
// priority.
func abortOutput(rid string, index int) map[string]any {
	out := map[string]any{"text": "", "output_ids": []any{}, "meta_info": map[string]any{
		"id":                rid,
		"finish_reason":     map[string]any{"type": "abort", "status_code": 503.0, "message": priorityDisabledMsg},
		"weight_version":    "default",
		"e2e_latency":       0.0,
		"completion_tokens": 0.0,
	}}
	if index >= 0 {
		out["index"] = float64(index)
	}
	return out
}

func TestPriorityAbortWhenDisabled(t *testing.T) {
	abort := Config{AbortOnPriorityWhenDisabled: true}
	unreachable := `"bootstrap_host":"127.0.0.1","bootstrap_port":1,"bootstrap_room":7`
	tests := []struct {
		name       string
		cfg        Config
		path, body string
		wantStatus int
		wantBody   map[string]any // non-streaming error body; nil: skip
		wantEvents []any          // streaming events before [DONE]; nil: skip
		wantErr    string         // the record's Error
		wantPrio   *int64
	}{
		{name: "generate", cfg: abort, path: "/generate", body: `{"text":"hello","priority":3}`,
			wantStatus: 503, wantBody: errResp(priorityDisabledMsg, "503", 503), wantErr: priorityDisabledMsg, wantPrio: i64p(3)},
		{name: "chat", cfg: abort, path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hi"}],"priority":0}`,
			wantStatus: 503, wantBody: errResp(priorityDisabledMsg, "503", 503), wantErr: priorityDisabledMsg, wantPrio: i64p(0)},
		{name: "completions", cfg: abort, path: "/v1/completions", body: `{"prompt":"hi","priority":-2}`,
			wantStatus: 503, wantBody: errResp(priorityDisabledMsg, "503", 503), wantErr: priorityDisabledMsg, wantPrio: i64p(-2)},
		{name: "generate stream", cfg: abort, path: "/generate", body: `{"text":"hello","priority":3,"stream":true,"rid":"r1"}`,
			wantStatus: 200, wantEvents: []any{abortOutput("r1", -1)}, wantErr: priorityDisabledMsg, wantPrio: i64p(3)},
		{name: "generate batch stream", cfg: abort, path: "/generate", body: `{"text":["a","b"],"priority":3,"stream":true,"rid":"r"}`,
			wantStatus: 200, wantEvents: []any{abortOutput("r_0", 0), abortOutput("r_1", 1)}, wantErr: priorityDisabledMsg, wantPrio: i64p(3)},
		{name: "chat stream", cfg: abort, path: "/v1/chat/completions",
			body:       `{"messages":[{"role":"user","content":"hi"}],"priority":1,"stream":true,"n":2}`,
			wantStatus: 200, wantEvents: []any{map[string]any{"error": errResp(priorityDisabledMsg, "SERVICE_UNAVAILABLE", 503)}},
			wantErr: priorityDisabledMsg, wantPrio: i64p(1)},
		{name: "completions stream", cfg: abort, path: "/v1/completions", body: `{"prompt":"hi","priority":1,"stream":true}`,
			wantStatus: 200, wantEvents: []any{map[string]any{"error": errResp(priorityDisabledMsg, "SERVICE_UNAVAILABLE", 503)}},
			wantErr: priorityDisabledMsg, wantPrio: i64p(1)},
		{name: "engine model", cfg: Config{Profile: "dense-8b-h100", AbortOnPriorityWhenDisabled: true}, path: "/generate",
			body: `{"input_ids":[1,2,3],"priority":3}`, wantStatus: 503, wantErr: priorityDisabledMsg, wantPrio: i64p(3)},
		{name: "decode aborts before it looks for its prefill", cfg: Config{Mode: ModeDecode, AbortOnPriorityWhenDisabled: true},
			path: "/generate", body: `{"text":"hello","priority":3,` + unreachable + `}`,
			wantStatus: 503, wantBody: errResp(priorityDisabledMsg, "503", 503), wantErr: priorityDisabledMsg, wantPrio: i64p(3)},
		{name: "no priority", cfg: abort, path: "/generate", body: `{"text":"hello"}`, wantStatus: 200},
		{name: "null priority", cfg: abort, path: "/generate", body: `{"text":"hello","priority":null}`, wantStatus: 200},
		{name: "ignored without the flag", cfg: Config{}, path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hi"}],"priority":3}`, wantStatus: 200, wantPrio: i64p(3)},
		{name: "served with priority scheduling", cfg: Config{EnablePriorityScheduling: true, AbortOnPriorityWhenDisabled: true},
			path: "/v1/completions", body: `{"prompt":"hi","priority":3}`, wantStatus: 200, wantPrio: i64p(3)},
		{name: "responses does not pass priority on", cfg: abort, path: "/v1/responses",
			body: `{"input":"hi","priority":3}`, wantStatus: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startTest(t, tc.cfg)
			r := post(t, ts.api.URL+tc.path, tc.body)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			if tc.wantBody != nil {
				var got map[string]any
				r.json(t, &got)
				if !reflect.DeepEqual(got, tc.wantBody) {
					t.Errorf("body %s, want %v", r.body, tc.wantBody)
				}
			}
			if tc.wantEvents != nil {
				checkEvents(t, r.body, tc.wantEvents)
			}
			rec := lastRecord(t, ts.sim)
			if rec.Status != tc.wantStatus || rec.Error != tc.wantErr || !reflect.DeepEqual(rec.Priority, tc.wantPrio) {
				t.Errorf("record status %d error %q priority %v, want %d %q %v",
					rec.Status, rec.Error, rec.Priority, tc.wantStatus, tc.wantErr, tc.wantPrio)
			}
		})
	}
}

// checkEvents compares an SSE body with want (JSON events) and [DONE].
func checkEvents(t *testing.T, body []byte, want []any) {
	t.Helper()
	evs := sseEvents(t, body)
	if len(evs) != len(want)+1 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("events %q: want %d and [DONE]", evs, len(want))
	}
	for i, w := range want {
		var got any
		if err := json.Unmarshal([]byte(evs[i]), &got); err != nil {
			t.Fatalf("event %q: %v", evs[i], err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("event %d: %s, want %v", i, evs[i], w)
		}
	}
}

func TestPriorityRange(t *testing.T) {
	tests := []struct {
		name, value string
		wantPrio    *int64
		wantMsg     string // "" for success
	}{
		{name: "largest", value: "9223372036854775807", wantPrio: i64p(math.MaxInt64)},
		{name: "smallest", value: "-9223372036854775808", wantPrio: i64p(math.MinInt64)},
		{name: "integral float", value: "2.0", wantPrio: i64p(2)},
		{name: "above int64", value: "9223372036854775808", wantMsg: priorityRangeMsg},
		{name: "below int64", value: "-9223372036854775809", wantMsg: priorityRangeMsg},
		{name: "huge exponent", value: "1e19", wantMsg: priorityRangeMsg},
		{name: "fraction", value: "1.5", wantMsg: "priority: Input should be a valid integer, got 1.5"},
		{name: "string", value: `"3"`, wantMsg: `priority: Input should be a valid integer, got "3"`},
	}
	ts := startTest(t, Config{EnablePriorityScheduling: true})
	for _, route := range []struct{ path, body string }{
		{"/generate", `{"text":"hello","priority":%s}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"priority":%s}`},
		{"/v1/completions", `{"prompt":"hi","priority":%s}`},
	} {
		for _, tc := range tests {
			t.Run(route.path+"/"+tc.name, func(t *testing.T) {
				r := post(t, ts.api.URL+route.path, strings.Replace(route.body, "%s", tc.value, 1))
				rec := lastRecord(t, ts.sim)
				if tc.wantMsg == "" {
					if r.status != http.StatusOK || !reflect.DeepEqual(rec.Priority, tc.wantPrio) {
						t.Fatalf("status %d, recorded priority %v: want 200 and %d: %s", r.status, rec.Priority, *tc.wantPrio, r.body)
					}
					return
				}
				want := errorBody(routeGenerate, badRequestf("%s", tc.wantMsg))
				if route.path != "/generate" {
					want = errorBody(routeChat, badRequestf("%s", tc.wantMsg))
				}
				if r.status != http.StatusBadRequest || string(r.body) != string(want) {
					t.Fatalf("got %d %s, want 400 %s", r.status, r.body, want)
				}
				if rec.Status != http.StatusBadRequest || rec.Error != tc.wantMsg {
					t.Fatalf("record %d %q", rec.Status, rec.Error)
				}
			})
		}
	}
}

// TestPriorityInRecords checks that GET /sim/requests shows the priority
// each request carried, null when it had none.
func TestPriorityInRecords(t *testing.T) {
	ts := startTest(t, Config{EnablePriorityScheduling: true, ScheduleLowPriorityValuesFirst: true})
	bodies := []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"priority":7}`, "7"},
		{"/generate", `{"text":"hello"}`, "null"},
		{"/v1/completions", `{"prompt":"hi","priority":-9223372036854775808}`, "-9223372036854775808"},
	}
	for _, b := range bodies {
		if r := post(t, ts.api.URL+b.path, b.body); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", b.path, r.status, r.body)
		}
	}
	r := get(t, ts.api.URL+"/sim/requests")
	var recs []map[string]json.RawMessage
	r.json(t, &recs)
	if len(recs) != len(bodies) {
		t.Fatalf("%d records, want %d", len(recs), len(bodies))
	}
	for i, b := range bodies {
		if got := string(recs[i]["priority"]); got != b.want {
			t.Errorf("%s: priority %s, want %s", b.path, got, b.want)
		}
	}
}

// i64p returns a pointer to v.
func i64p(v int64) *int64 { return &v }
