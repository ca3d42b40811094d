package sim

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// loadsBody is the /v1/loads response, with loads kept generic.
type loadsBody struct {
	Timestamp   string           `json:"timestamp"`
	Version     string           `json:"version"`
	DPRankCount int              `json:"dp_rank_count"`
	Loads       []map[string]any `json:"loads"`
	Aggregate   map[string]any   `json:"aggregate"`
}

func TestLoadsShapeAndInclude(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeDecode, DPSize: 2})
	core := []string{"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "num_total_tokens",
		"max_total_num_tokens", "token_usage", "gen_throughput", "cache_hit_rate", "utilization",
		"max_running_requests", "num_total_reqs"}
	with := func(extra ...string) []string { return append(slices.Clone(core), extra...) }
	tests := []struct {
		name       string
		query      string
		wantStatus int
		wantRanks  []float64
		wantKeys   []string
	}{
		{name: "default is all", query: "", wantStatus: 200, wantRanks: []float64{0, 1},
			wantKeys: with("memory", "disaggregation", "queues")},
		{name: "all", query: "?include=all", wantStatus: 200, wantRanks: []float64{0, 1},
			wantKeys: with("memory", "disaggregation", "queues")},
		{name: "core only", query: "?include=core", wantStatus: 200, wantRanks: []float64{0, 1}, wantKeys: core},
		{name: "core and disagg", query: "?include=core,disagg", wantStatus: 200, wantRanks: []float64{0, 1},
			wantKeys: with("disaggregation")},
		{name: "smg include set", query: "?include=core,disagg,queues,memory", wantStatus: 200, wantRanks: []float64{0, 1},
			wantKeys: with("memory", "disaggregation", "queues")},
		{name: "spec and lora are dropped", query: "?include=spec,lora", wantStatus: 200, wantRanks: []float64{0, 1}, wantKeys: core},
		{name: "dp_rank filter", query: "?dp_rank=1&include=core", wantStatus: 200, wantRanks: []float64{1}, wantKeys: core},
		{name: "unknown section", query: "?include=core,bogus", wantStatus: 400},
		{name: "bad dp_rank", query: "?dp_rank=x", wantStatus: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, ts.api.URL+"/v1/loads"+tc.query)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			if tc.wantStatus != 200 {
				return
			}
			var b loadsBody
			r.json(t, &b)
			if _, err := time.Parse(time.RFC3339Nano, b.Timestamp); err != nil || !strings.HasSuffix(b.Timestamp, "+00:00") {
				t.Fatalf("timestamp %q: %v", b.Timestamp, err)
			}
			if b.Version != Version || b.DPRankCount != len(tc.wantRanks) || len(b.Loads) != len(tc.wantRanks) {
				t.Fatalf("header fields %+v", b)
			}
			for i, l := range b.Loads {
				if l["dp_rank"] != tc.wantRanks[i] {
					t.Fatalf("load %d has dp_rank %v", i, l["dp_rank"])
				}
				var keys []string
				for k := range l {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				want := slices.Clone(tc.wantKeys)
				sort.Strings(want)
				if !slices.Equal(keys, want) {
					t.Fatalf("keys %v, want %v", keys, want)
				}
				if l["max_total_num_tokens"] != float64(DefaultMaxTotalTokens) {
					t.Fatalf("max_total_num_tokens %v", l["max_total_num_tokens"])
				}
				if d, ok := l["disaggregation"].(map[string]any); ok && d["mode"] != "decode" {
					t.Fatalf("disaggregation %v", d)
				}
			}
			for _, k := range []string{"total_running_reqs", "total_waiting_reqs", "total_reqs", "avg_token_usage", "avg_throughput", "avg_utilization"} {
				if _, ok := b.Aggregate[k]; !ok {
					t.Fatalf("aggregate lacks %s: %v", k, b.Aggregate)
				}
			}
		})
	}
}

func TestLoadsAreLive(t *testing.T) {
	tests := []struct {
		name     string
		mode     Mode
		body     string
		wantKey  string // rank 1 field that must be 1 while in flight
		wantUsed float64
	}{
		{name: "null running", mode: ModeNull,
			body:    `{"messages":[{"role":"user","content":"12345678"}],"routed_dp_rank":1}`,
			wantKey: "num_running_reqs", wantUsed: 2},
		{name: "decode transfer queue", mode: ModeDecode,
			body:    `{"messages":[{"role":"user","content":"123456789012"}],"routed_dp_rank":1,"bootstrap_host":"127.0.0.1","bootstrap_room":1}`,
			wantKey: "num_total_reqs", wantUsed: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Mode: tc.mode, DPSize: 2, DecodePerToken: time.Hour, MaxTotalTokens: 1000, KVTimeout: time.Minute}
			if tc.mode == ModeDecode {
				p := startTest(t, Config{Mode: ModePrefill, DPSize: 2})
				_, cfg.BootstrapPort = p.bootHostPort(t)
			}
			ts := startTest(t, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				postCtx(ctx, t, ts.api.URL+"/v1/chat/completions", tc.body)
			}()
			var b loadsBody
			eventually(t, "request in flight", func() bool {
				get(t, ts.api.URL+"/v1/loads").json(t, &b)
				return b.Loads[1][tc.wantKey] == 1.0
			})
			l := b.Loads[1]
			if l["num_used_tokens"] != tc.wantUsed || l["token_usage"] != tc.wantUsed/1000 {
				t.Fatalf("rank 1 load %v", l)
			}
			if b.Loads[0]["num_used_tokens"] != 0.0 || b.Aggregate["total_reqs"] != 1.0 {
				t.Fatalf("loads %+v", b)
			}
			if tc.mode == ModeDecode && l["disaggregation"].(map[string]any)["decode_transfer_queue_reqs"] != 1.0 {
				t.Fatalf("transfer queue %v", l["disaggregation"])
			}
			cancel()
			<-done
			eventually(t, "load released", func() bool {
				get(t, ts.api.URL+"/v1/loads").json(t, &b)
				return b.Loads[1]["num_used_tokens"] == 0.0 && b.Loads[1]["num_total_reqs"] == 0.0
			})
		})
	}
}
