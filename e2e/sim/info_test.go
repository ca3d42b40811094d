package sim

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestServerInfo(t *testing.T) {
	tests := []struct {
		name       string
		cfg        Config
		path       string
		wantStatus int
		want       map[string]any
	}{
		{name: "prefill", cfg: Config{Mode: ModePrefill, DPSize: 4, BootstrapPort: 9123}, path: "/server_info", wantStatus: 200,
			want: map[string]any{"dp_size": 4.0, "tp_size": 1.0, "pp_size": 1.0, "enable_dp_attention": true,
				"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 9123.0,
				"disaggregation_transfer_backend": "mooncake", "load_balance_method": "follow_bootstrap_room",
				"served_model_name": "sim-model", "model_path": "sim-model", "max_running_requests": 256.0,
				"max_total_num_tokens": 500000.0, "version": "0.5.19"}},
		{name: "decode", cfg: Config{Mode: ModeDecode, DPSize: 2, Model: "m2", MaxTotalTokens: 1234}, path: "/server_info", wantStatus: 200,
			want: map[string]any{"dp_size": 2.0, "enable_dp_attention": true, "disaggregation_mode": "decode",
				"load_balance_method": "round_robin", "served_model_name": "m2", "max_total_num_tokens": 1234.0}},
		{name: "null dp1", cfg: Config{Mode: ModeNull}, path: "/server_info", wantStatus: 200,
			want: map[string]any{"dp_size": 1.0, "enable_dp_attention": false, "disaggregation_mode": "null",
				"load_balance_method": "round_robin"}},
		{name: "deprecated alias", cfg: Config{Mode: ModeNull, DPSize: 2}, path: "/get_server_info", wantStatus: 200,
			want: map[string]any{"dp_size": 2.0}},
		{name: "legacy has no /server_info", cfg: Config{Mode: ModeDecode, LegacyServerInfo: true}, path: "/server_info", wantStatus: 404},
		{name: "legacy serves /get_server_info", cfg: Config{Mode: ModeDecode, LegacyServerInfo: true}, path: "/get_server_info",
			wantStatus: 200, want: map[string]any{"disaggregation_mode": "decode"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startTest(t, tc.cfg)
			r := get(t, ts.api.URL+tc.path)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			if tc.wantStatus != 200 {
				return
			}
			var info map[string]any
			r.json(t, &info)
			for k, v := range tc.want {
				if info[k] != v {
					t.Errorf("%s = %v (%T), want %v", k, info[k], info[k], v)
				}
			}
			dp := tc.cfg.DPSize
			if dp == 0 {
				dp = 1
			}
			if states, _ := info["internal_states"].([]any); len(states) != dp {
				t.Errorf("internal_states has %d entries, want %d", len(states), dp)
			}
		})
	}
}

func TestMiscEndpoints(t *testing.T) {
	p := startTest(t, Config{Mode: ModePrefill, DPSize: 3, Model: "mm"})
	tests := []struct {
		name       string
		url        string
		wantStatus int
		wantBody   string // exact, "" to skip
		check      func(t *testing.T, body []byte)
	}{
		{name: "health", url: p.api.URL + "/health", wantStatus: 200, wantBody: ""},
		{name: "bootstrap health", url: p.boot.URL + "/health", wantStatus: 200, wantBody: "OK"},
		{name: "bootstrap route", url: p.boot.URL + "/route", wantStatus: 200, check: func(t *testing.T, b []byte) {
			var info prefillInfo
			if err := json.Unmarshal(b, &info); err != nil || info.DPSize != 3 || !info.FollowBootstrapRoom || info.PageSize != 1 {
				t.Fatalf("route %s: %v", b, err)
			}
		}},
		{name: "unknown room", url: p.boot.URL + "/sim/kv?room=42", wantStatus: 404, wantBody: `{"room":42,"state":"unknown"}`},
		{name: "bad room", url: p.boot.URL + "/sim/kv?room=x", wantStatus: 400},
		{name: "models", url: p.api.URL + "/v1/models", wantStatus: 200, check: func(t *testing.T, b []byte) {
			var m struct {
				Object string
				Data   []struct {
					ID     string `json:"id"`
					Object string `json:"object"`
					Root   string `json:"root"`
				}
			}
			if err := json.Unmarshal(b, &m); err != nil || m.Object != "list" || len(m.Data) != 1 || m.Data[0].ID != "mm" || m.Data[0].Root != "mm" {
				t.Fatalf("models %s: %v", b, err)
			}
		}},
		{name: "unknown path", url: p.api.URL + "/nope", wantStatus: 404, wantBody: `{"detail":"Not Found"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, tc.url)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			if tc.check != nil {
				tc.check(t, r.body)
			} else if tc.wantStatus == 200 || tc.wantBody != "" {
				if string(r.body) != tc.wantBody {
					t.Fatalf("body %q, want %q", r.body, tc.wantBody)
				}
			}
		})
	}
	if p.sim.BootstrapHandler() == nil {
		t.Fatal("prefill without bootstrap handler")
	}
	if d := startTest(t, Config{Mode: ModeDecode}); d.sim.BootstrapHandler() != nil {
		t.Fatal("decode has a bootstrap handler")
	}
}

func TestRequestRecords(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeDecode, DPSize: 2, KVTimeout: 1})
	post(t, ts.api.URL+"/v1/completions", `{"prompt":"x","bootstrap_host":"2.2.2.2","bootstrap_room":[3],"routed_dp_rank":1,"max_tokens":1}`,
		"X-Request-Id", "abc", "Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	post(t, ts.api.URL+"/generate", `{"text":`)
	r := get(t, ts.api.URL+"/sim/requests")
	var recs []map[string]any
	r.json(t, &recs)
	if len(recs) != 2 {
		t.Fatalf("got %d records", len(recs))
	}
	first := recs[0]
	for k, want := range map[string]any{
		"path": "/v1/completions", "mode": "decode", "dp_rank": 1.0, "rank_source": "body",
		"bootstrap_host": "2.2.2.2", "bootstrap_port": nil, "status": 200.0, "error": "", "stream": false,
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if first[k] != want {
			t.Errorf("%s = %v, want %v", k, first[k], want)
		}
	}
	if h := first["headers"].(map[string]any); h["x-request-id"] != "abc" || h["content-type"] != "application/json" {
		t.Errorf("headers %v", h)
	}
	if b := first["body"].(map[string]any); b["prompt"] != "x" {
		t.Errorf("body %v", b)
	}
	if rooms := first["bootstrap_rooms"].([]any); len(rooms) != 1 || rooms[0] != 3.0 {
		t.Errorf("bootstrap_rooms %v", rooms)
	}
	second := recs[1]
	if _, ok := second["traceparent"]; ok {
		t.Errorf("a request without traceparent recorded one: %v", second["traceparent"])
	}
	if second["status"] != 400.0 || second["body"] != `{"text":` || second["dp_rank"] != nil || second["rank_source"] != nil {
		t.Errorf("malformed request record %v", second)
	}

	req, _ := http.NewRequest(http.MethodDelete, ts.api.URL+"/sim/requests", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(ts.sim.Records()) != 0 {
		t.Fatalf("DELETE: %d, %d records left", resp.StatusCode, len(ts.sim.Records()))
	}
}
