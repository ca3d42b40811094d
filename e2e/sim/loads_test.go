package sim

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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

// sglangDisaggKeys are the keys of a rank's disaggregation section in SGLang
// 0.5.23's /v1/loads (load_snapshot.py DisaggregationMetrics), present in
// every mode.
var sglangDisaggKeys = []string{"mode", "prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs",
	"decode_prealloc_queue_reqs", "decode_transfer_queue_reqs", "decode_retracted_queue_reqs",
	"kv_transfer_speed_gb_s", "kv_transfer_latency_ms"}

// The disaggregation section has SGLang 0.5.23's keys in every mode, and
// each PD queue of the snapshot in the field of its mode: a prefill's
// bootstrap queue and KV being sent, a decode's prealloc queue and KV being
// received; the other mode's fields, and an aggregated server's, are 0.
func TestLoadsDisaggregationSection(t *testing.T) {
	snap := rankSnapshot{dpRank: 1, running: 1, waiting: 2, bootstrap: 3, transfer: 4, xferMS: 7.5, xferGBps: 21}
	tests := []struct {
		mode Mode
		want map[string]any
	}{
		{mode: ModePrefill, want: map[string]any{"mode": "prefill",
			"prefill_bootstrap_queue_reqs": 3, "prefill_inflight_queue_reqs": 4,
			"decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
			"kv_transfer_speed_gb_s": 21.0, "kv_transfer_latency_ms": 7.5}},
		{mode: ModeDecode, want: map[string]any{"mode": "decode",
			"prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
			"decode_prealloc_queue_reqs": 2, "decode_transfer_queue_reqs": 4, "decode_retracted_queue_reqs": 0,
			"kv_transfer_speed_gb_s": 21.0, "kv_transfer_latency_ms": 7.5}},
		{mode: ModeNull, want: map[string]any{"mode": "null",
			"prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
			"decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
			"kv_transfer_speed_gb_s": 21.0, "kv_transfer_latency_ms": 7.5}},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			cfg := Config{Mode: tc.mode, MaxTotalTokens: 1000, MaxRunningRequests: 8}
			got, ok := rankLoadJSON(cfg, snap, map[string]bool{"disagg": true})["disaggregation"].(map[string]any)
			if !ok {
				t.Fatalf("no disaggregation section")
			}
			keys := slices.Sorted(maps.Keys(got))
			want := slices.Sorted(slices.Values(sglangDisaggKeys))
			if !slices.Equal(keys, want) {
				t.Fatalf("disaggregation keys %v, want SGLang 0.5.23's %v", keys, want)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("disaggregation %v, want %v", got, tc.want)
			}
		})
	}
}

// Every server's /v1/loads has the section with SGLang 0.5.23's keys.
func TestLoadsDisaggregationKeysServed(t *testing.T) {
	for _, mode := range []Mode{ModeNull, ModePrefill, ModeDecode} {
		t.Run(string(mode), func(t *testing.T) {
			ts := startTest(t, Config{Mode: mode})
			var b loadsBody
			get(t, ts.api.URL+"/v1/loads?include=core,disagg").json(t, &b)
			d, ok := b.Loads[0]["disaggregation"].(map[string]any)
			if !ok {
				t.Fatalf("no disaggregation section: %v", b.Loads[0])
			}
			keys := slices.Sorted(maps.Keys(d))
			if want := slices.Sorted(slices.Values(sglangDisaggKeys)); !slices.Equal(keys, want) {
				t.Fatalf("disaggregation keys %v, want SGLang 0.5.23's %v", keys, want)
			}
			if d["mode"] != string(mode) {
				t.Fatalf("mode %v, want %s", d["mode"], mode)
			}
		})
	}
}

// /v1/loads?format=prometheus flattens the included sections as SGLang
// 0.5.23 does (v1_loads.py _format_loads_prometheus): the PD queues are
// sglang_disagg_<field>{dp_rank="N"} gauges, and the text parses.
func TestLoadsPrometheusFormat(t *testing.T) {
	ts := startTest(t, Config{Mode: ModePrefill, DPSize: 2})
	tests := []struct {
		query       string
		wantPresent []string
		wantAbsent  []string
	}{
		{query: "", wantPresent: []string{"sglang_num_running_reqs", "sglang_num_waiting_reqs", "sglang_token_usage",
			"sglang_disagg_prefill_bootstrap_queue_reqs", "sglang_disagg_prefill_inflight_queue_reqs",
			"sglang_disagg_decode_prealloc_queue_reqs", "sglang_disagg_decode_transfer_queue_reqs",
			"sglang_disagg_decode_retracted_queue_reqs", "sglang_disagg_kv_transfer_latency_ms",
			"sglang_queues_waiting", "sglang_memory_token_capacity"},
			wantAbsent: []string{"sglang_disagg_prefill_prealloc_queue_reqs", "sglang_disagg_mode", "sglang_dp_rank"}},
		{query: "&include=core", wantPresent: []string{"sglang_num_running_reqs"},
			wantAbsent: []string{"sglang_disagg_prefill_bootstrap_queue_reqs", "sglang_queues_waiting"}},
		{query: "&include=core,disagg", wantPresent: []string{"sglang_num_running_reqs", "sglang_disagg_prefill_bootstrap_queue_reqs"},
			wantAbsent: []string{"sglang_queues_waiting", "sglang_memory_token_capacity"}},
	}
	for _, tc := range tests {
		t.Run("query"+tc.query, func(t *testing.T) {
			r := get(t, ts.api.URL+"/v1/loads?format=prometheus"+tc.query)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			p := expfmt.NewTextParser(model.LegacyValidation)
			fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, r.body)
			}
			for _, name := range tc.wantPresent {
				f, ok := fams[name]
				if !ok {
					t.Fatalf("missing %s:\n%s", name, r.body)
				}
				if f.GetType().String() != "GAUGE" || len(f.GetMetric()) != 2 {
					t.Fatalf("%s: %v with %d samples, want a gauge with one per rank", name, f.GetType(), len(f.GetMetric()))
				}
				for i, m := range f.GetMetric() {
					if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "dp_rank" || l[0].GetValue() != strconv.Itoa(i) {
						t.Fatalf("%s sample %d labels %v", name, i, l)
					}
				}
			}
			for _, name := range tc.wantAbsent {
				if _, ok := fams[name]; ok {
					t.Fatalf("%s present:\n%s", name, r.body)
				}
			}
		})
	}
}
