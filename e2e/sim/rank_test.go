package sim

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestExplicitRank(t *testing.T) {
	tests := []struct {
		name     string
		route    routeKind
		header   string // "" means absent
		bodyRank *int
		dpSize   int
		want     *pinnedRank
		wantErr  string
	}{
		{name: "nothing pinned", route: routeChat, dpSize: 4},
		{name: "body only", route: routeChat, bodyRank: intp(2), dpSize: 4, want: &pinnedRank{2, sourceBody}},
		{name: "header only", route: routeCompletions, header: "3", dpSize: 4, want: &pinnedRank{3, sourceHeader}},
		{name: "header beats body", route: routeChat, header: "1", bodyRank: intp(2), dpSize: 4, want: &pinnedRank{1, sourceHeader}},
		{name: "header on responses", route: routeResponses, header: "1", dpSize: 4, want: &pinnedRank{1, sourceHeader}},
		{name: "generate ignores header", route: routeGenerate, header: "1", bodyRank: intp(2), dpSize: 4, want: &pinnedRank{2, sourceBody}},
		{name: "generate ignores bad header", route: routeGenerate, header: "x", dpSize: 4},
		{name: "header with spaces", route: routeChat, header: " 2 ", dpSize: 4, want: &pinnedRank{2, sourceHeader}},
		{name: "non-integer header", route: routeChat, header: "abc", dpSize: 4,
			wantErr: "Invalid X-Data-Parallel-Rank header: must be an integer, got 'abc'"},
		{name: "float header", route: routeCompletions, header: "1.0", dpSize: 4,
			wantErr: "Invalid X-Data-Parallel-Rank header: must be an integer, got '1.0'"},
		{name: "out of range high", route: routeChat, bodyRank: intp(4), dpSize: 4, wantErr: "routed_dp_rank=4 out of range [0, 4)"},
		{name: "out of range negative header", route: routeChat, header: "-1", dpSize: 4, wantErr: "routed_dp_rank=-1 out of range [0, 4)"},
		{name: "dp1 rank 0 ignored", route: routeChat, bodyRank: intp(0), dpSize: 1},
		{name: "dp1 header 0 ignored", route: routeChat, header: "0", dpSize: 1},
		{name: "dp1 rank 1 rejected", route: routeGenerate, bodyRank: intp(1), dpSize: 1, wantErr: "routed_dp_rank=1 out of range [0, 1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.header != "" {
				h.Set(dpRankHeader, tc.header)
			}
			got, err := explicitRank(tc.route, h, tc.bodyRank, tc.dpSize)
			if tc.wantErr != "" {
				if err == nil || err.msg != tc.wantErr || err.status != http.StatusBadRequest {
					t.Fatalf("err = %v, want 400 %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPyMod(t *testing.T) {
	tests := []struct {
		a    int64
		n    int
		want int
	}{{7, 4, 3}, {8, 4, 0}, {-1, 4, 3}, {9223372036854775807, 8, 7}, {5, 1, 0}}
	for _, tc := range tests {
		if got := pyMod(tc.a, tc.n); got != tc.want {
			t.Errorf("pyMod(%d, %d) = %d, want %d", tc.a, tc.n, got, tc.want)
		}
	}
}

// TestRankSelectionHTTP checks the rank a server actually serves on, per
// route and mode, through the HTTP API.
func TestRankSelectionHTTP(t *testing.T) {
	null := startTest(t, Config{Mode: ModeNull, DPSize: 4})
	prefill := startTest(t, Config{Mode: ModePrefill, DPSize: 4})
	tests := []struct {
		name       string
		srv        *testServer
		path       string
		body       string
		headers    []string
		wantStatus int
		wantRank   int
		wantSource rankSource
		wantErr    string
	}{
		{name: "chat header wins over body", srv: null, path: "/v1/chat/completions",
			body:    `{"messages":[{"role":"user","content":"hi"}],"routed_dp_rank":1}`,
			headers: []string{"X-Data-Parallel-Rank", "3"}, wantStatus: 200, wantRank: 3, wantSource: sourceHeader},
		{name: "completions body rank", srv: null, path: "/v1/completions",
			body: `{"prompt":"hi","routed_dp_rank":2}`, wantStatus: 200, wantRank: 2, wantSource: sourceBody},
		{name: "routed_dp_rank beats data_parallel_rank", srv: null, path: "/v1/completions",
			body: `{"prompt":"hi","routed_dp_rank":2,"data_parallel_rank":1}`, wantStatus: 200, wantRank: 2, wantSource: sourceBody},
		{name: "deprecated data_parallel_rank alone", srv: null, path: "/generate",
			body: `{"text":"hi","data_parallel_rank":1}`, wantStatus: 200, wantRank: 1, wantSource: sourceBody},
		{name: "generate ignores header", srv: null, path: "/generate",
			body:    `{"text":"hi","routed_dp_rank":0}`,
			headers: []string{"X-Data-Parallel-Rank", "3"}, wantStatus: 200, wantRank: 0, wantSource: sourceBody},
		{name: "responses honours header", srv: null, path: "/v1/responses",
			body:    `{"input":"hi"}`,
			headers: []string{"X-Data-Parallel-Rank", "2"}, wantStatus: 200, wantRank: 2, wantSource: sourceHeader},
		{name: "bad header 400", srv: null, path: "/v1/chat/completions",
			body:    `{"messages":[{"role":"user","content":"hi"}]}`,
			headers: []string{"X-Data-Parallel-Rank", "two"}, wantStatus: 400,
			wantErr: "Invalid X-Data-Parallel-Rank header: must be an integer, got 'two'"},
		{name: "out of range 400", srv: null, path: "/generate",
			body: `{"text":"hi","routed_dp_rank":9}`, wantStatus: 400, wantErr: "routed_dp_rank=9 out of range [0, 4)"},
		{name: "prefill follows room", srv: prefill, path: "/generate",
			body: `{"text":"hi","bootstrap_host":"127.0.0.1","bootstrap_room":14}`, wantStatus: 200, wantRank: 2, wantSource: sourceRoom},
		{name: "prefill generate header ignored, room used", srv: prefill, path: "/generate",
			body:    `{"text":"hi","bootstrap_host":"127.0.0.1","bootstrap_room":13}`,
			headers: []string{"X-Data-Parallel-Rank", "0"}, wantStatus: 200, wantRank: 1, wantSource: sourceRoom},
		{name: "prefill pinned rank agreeing with room", srv: prefill, path: "/v1/chat/completions",
			body:    `{"messages":[{"role":"user","content":"hi"}],"bootstrap_host":"127.0.0.1","bootstrap_room":13}`,
			headers: []string{"X-Data-Parallel-Rank", "1"}, wantStatus: 200, wantRank: 1, wantSource: sourceHeader},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.srv.api.URL+tc.path, tc.body, tc.headers...)
			if resp.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.status, tc.wantStatus, resp.body)
			}
			rec := lastRecord(t, tc.srv.sim)
			if tc.wantErr != "" {
				if !strings.Contains(string(resp.body), tc.wantErr) || rec.Error != tc.wantErr {
					t.Fatalf("body %s / record error %q, want %q", resp.body, rec.Error, tc.wantErr)
				}
				return
			}
			if rec.DPRank == nil || *rec.DPRank != tc.wantRank || rec.RankSource == nil || *rec.RankSource != string(tc.wantSource) {
				t.Fatalf("record rank %v source %v, want %d %s", deref(rec.DPRank), deref(rec.RankSource), tc.wantRank, tc.wantSource)
			}
			if got := resp.header.Get("X-Sim-DP-Rank"); got != fmt.Sprint(tc.wantRank) {
				t.Fatalf("X-Sim-DP-Rank = %q, want %d", got, tc.wantRank)
			}
		})
	}
}

func TestRoundRobin(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull, DPSize: 3})
	var got []string
	for i := 0; i < 6; i++ {
		resp := post(t, ts.api.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1}`)
		got = append(got, resp.header.Get("X-Sim-DP-Rank"))
	}
	if want := "0,1,2,0,1,2"; strings.Join(got, ",") != want {
		t.Fatalf("ranks %v, want %s", got, want)
	}
	if src := lastRecord(t, ts.sim).RankSource; src == nil || *src != string(sourceRoundRobin) {
		t.Fatalf("rank_source = %v, want round_robin", deref(src))
	}
}

// deref formats a pointer's value for messages.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
