package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// stageExposition renders StageMetric's _sum and _count series in the
// text format, one per (labels, sum, count) triple.
func stageExposition(series ...string) string {
	var b strings.Builder
	b.WriteString("# HELP sglang:per_stage_req_latency_seconds The latency of each stage of requests.\n")
	b.WriteString("# TYPE sglang:per_stage_req_latency_seconds histogram\n")
	for i := 0; i+2 < len(series); i += 3 {
		labels, sum, count := series[i], series[i+1], series[i+2]
		fmt.Fprintf(&b, "sglang:per_stage_req_latency_seconds_bucket{%s,le=\"+Inf\"} %s\n", labels, count)
		fmt.Fprintf(&b, "sglang:per_stage_req_latency_seconds_sum{%s} %s\n", labels, sum)
		fmt.Fprintf(&b, "sglang:per_stage_req_latency_seconds_count{%s} %s\n", labels, count)
	}
	return b.String()
}

// serveMetrics serves body on /metrics.
func serveMetrics(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestReadStageTotals(t *testing.T) {
	prefill0 := stageExposition(
		`dp_rank="0",engine_type="prefill",stage="prefill_waiting"`, "1.5", "10",
		`dp_rank="1",engine_type="prefill",stage="prefill_waiting"`, "0.5", "10",
		`dp_rank="0",engine_type="prefill",stage="prefill_forward"`, "2", "10")
	prefill1 := stageExposition(`engine_type="prefill",stage="prefill_forward"`, "1", "5")
	decode := stageExposition(`engine_type="decode",stage="decode_waiting"`, "0.25", "20")
	other := "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"
	tests := []struct {
		name    string
		engines map[string]string // role/name -> exposition
		want    StageTotals
	}{
		{
			name:    "summed over ranks and a role's engines",
			engines: map[string]string{"prefill/p0": prefill0, "prefill/p1": prefill1, "decode/d0": decode},
			want: StageTotals{
				{RolePrefill, "prefill_waiting"}: {Sum: 2, Count: 20},
				{RolePrefill, "prefill_forward"}: {Sum: 3, Count: 15},
				{RoleDecode, "decode_waiting"}:   {Sum: 0.25, Count: 20},
			},
		},
		{
			name:    "engines without the histogram add nothing",
			engines: map[string]string{"prefill/p0": other, "decode/d0": other},
			want:    StageTotals{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var engines []Engine
			for id, body := range tc.engines {
				role, name, _ := strings.Cut(id, "/")
				engines = append(engines, Engine{Role: role, Name: name, URL: serveMetrics(t, body)})
			}
			got, err := ReadStageTotals(context.Background(), http.DefaultClient, engines)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("totals %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a failed scrape is an error", func(t *testing.T) {
		_, err := ReadStageTotals(context.Background(), http.DefaultClient, []Engine{{Role: RolePrefill, Name: "p0", URL: serveMetrics(t, "") + "/nope"}})
		if err == nil || !strings.Contains(err.Error(), "stage latencies of p0") {
			t.Fatalf("err %v, want one naming the engine", err)
		}
	})
}

func TestStageLatencies(t *testing.T) {
	before := StageTotals{
		{RolePrefill, "prefill_waiting"}:     {Sum: 1, Count: 10},
		{RoleDecode, "decode_waiting"}:       {Sum: 2, Count: 4},
		{RolePrefill, "prefill_forward"}:     {Sum: 5, Count: 10},
		{RoleDecode, "decode_transferred"}:   {Sum: 3, Count: 5},
		{RolePrefill, "prefill_bootstrap"}:   {Sum: 1, Count: 1},
		{RoleDecode, "decode_bootstrap"}:     {Sum: 0, Count: 0},
		{RolePrefill, "some_future_stage"}:   {Sum: 0, Count: 0},
		{RoleDecode, "decode_unrelated"}:     {Sum: 0, Count: 0},
		{"unified", "prefill_waiting"}:       {Sum: 0, Count: 0},
		{RolePrefill, "prefill_transfer_kv"}: {Sum: 0, Count: 0},
	}
	after := StageTotals{
		{RolePrefill, "prefill_waiting"}:   {Sum: 3, Count: 20},
		{RoleDecode, "decode_waiting"}:     {Sum: 2.5, Count: 14},
		{RolePrefill, "prefill_forward"}:   {Sum: 9, Count: 20},
		{RoleDecode, "decode_transferred"}: {Sum: 3, Count: 5},
		{RolePrefill, "prefill_bootstrap"}: {Sum: 1, Count: 1},
		{RoleDecode, "decode_bootstrap"}:   {Sum: 0.5, Count: 10},
		{RolePrefill, "some_future_stage"}: {Sum: 0.2, Count: 2},
		{"unified", "prefill_waiting"}:     {Sum: 0.01, Count: 1},
	}
	tests := []struct {
		name          string
		before, after StageTotals
		want          []StageLatency
	}{
		{
			name: "deltas, prefill then decode in SGLang's order; stages without new observations dropped",
			// prefill_bootstrap and decode_transferred did not move.
			before: before, after: after,
			want: []StageLatency{
				{Role: RolePrefill, Stage: "prefill_waiting", MeanMs: 200, Count: 10},
				{Role: RolePrefill, Stage: "prefill_forward", MeanMs: 400, Count: 10},
				{Role: RolePrefill, Stage: "some_future_stage", MeanMs: 100, Count: 2},
				{Role: RoleDecode, Stage: "decode_bootstrap", MeanMs: 50, Count: 10},
				{Role: RoleDecode, Stage: "decode_waiting", MeanMs: 50, Count: 10},
				{Role: "unified", Stage: "prefill_waiting", MeanMs: 10, Count: 1},
			},
		},
		{
			name:   "a stage new since before counts from zero",
			before: StageTotals{}, after: StageTotals{{RoleDecode, "decode_waiting"}: {Sum: 0.03, Count: 3}},
			want: []StageLatency{{Role: RoleDecode, Stage: "decode_waiting", MeanMs: 10, Count: 3}},
		},
		{name: "no reading before", before: nil, after: after, want: nil},
		{name: "no reading after", before: before, after: nil, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := stageLatencies(tc.before, tc.after)
			if len(got) != len(tc.want) {
				t.Fatalf("latencies %+v, want %+v", got, tc.want)
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.key() != w.key() || g.Count != w.Count || fmt.Sprintf("%.6f", g.MeanMs) != fmt.Sprintf("%.6f", w.MeanMs) {
					t.Fatalf("latency %d: %+v, want %+v (all %+v)", i, g, w, got)
				}
			}
		})
	}
}

func TestWriteStages(t *testing.T) {
	stages := func(pw, pf, px, db, dt, dw float64) []StageLatency {
		return []StageLatency{
			{Role: RolePrefill, Stage: "prefill_waiting", MeanMs: pw, Count: 90},
			{Role: RolePrefill, Stage: "prefill_forward", MeanMs: pf, Count: 90},
			{Role: RolePrefill, Stage: "prefill_transfer_kv_cache", MeanMs: px, Count: 89},
			{Role: RoleDecode, Stage: "decode_bootstrap", MeanMs: db, Count: 91},
			{Role: RoleDecode, Stage: "decode_transferred", MeanMs: dt, Count: 91},
			{Role: RoleDecode, Stage: "decode_waiting", MeanMs: dw, Count: 90},
		}
	}
	rep := Report{Summaries: []Summary{
		{Workload: WorkloadMultiTurn, Policy: PolicyEngineDefault, Rate: 2, TTFTms: Dist{Mean: 420}, HitRate: -1,
			Stages: stages(100, 250, 12.5, 0.4, 370, 8)},
		{Workload: WorkloadMultiTurn, Policy: "least_cost", Rate: 2, TTFTms: Dist{Mean: 450}, HitRate: -1,
			Stages: stages(140, 240, 12.5, 0, 395.5, 9)[:5]},
		{Workload: WorkloadMultiTurn, Policy: "least_cost", Rate: 4, Failed: "start stack: boom"},
		{Workload: WorkloadVariable, Policy: PolicyEngineDefault, Rate: 2, TTFTms: Dist{Mean: 300}, HitRate: -1},
	}}
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, rep); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"| load (sessions/s) | policy | TTFT mean | prefill_waiting | prefill_forward | prefill_transfer_kv_cache | prefill Σ | prefill n |" +
			" decode_bootstrap | decode_transferred | decode_waiting | decode Σ | decode n |\n" +
			"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		"| 2 | engine_default | 420 | 100.0 | 250.0 | 12.5 | 362.5 | 90 | 0.4 | 370.0 | 8.0 | 378.4 | 91 |\n",
		// least_cost's decode_waiting is missing.
		"| 2 | least_cost | 450 | 140.0 | 240.0 | 12.5 | 392.5 | 90 | 0.0 | 395.5 | - | 395.5 | 91 |\n",
		"| 4 | least_cost | failed | | | | | | | | | | |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if n := strings.Count(md, "**TTFT by stage**"); n != 1 {
		t.Errorf("%d stage tables, want one (the variable workload's cases have no stages)", n)
	}
	if t.Failed() {
		t.Log(md)
	}
}

func TestStageColumnAndLine(t *testing.T) {
	tests := []struct{ got, want string }{
		{stageColumn(StageKey{RolePrefill, "prefill_forward"}), "prefill_forward"},
		{stageColumn(StageKey{RoleDecode, "prefill_forward"}), "decode: prefill_forward"},
		{stagesLine([]StageLatency{{Role: RolePrefill, Stage: "prefill_waiting", MeanMs: 1.25}, {Role: RoleDecode, Stage: "decode_waiting", MeanMs: 3}}),
			"prefill_waiting 1.2 ms, decode_waiting 3.0 ms"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
