package load

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sglangLoadsExample is the /v1/loads example from the protocol notes, with
// the second rank filled in.
const sglangLoadsExample = `{"timestamp":"2026-08-20T10:30:00.123456+00:00","version":"0.5.19","dp_rank_count":2,
 "loads":[{"dp_rank":0,"num_running_reqs":5,"num_waiting_reqs":2,"num_used_tokens":40960,"num_total_tokens":45056,
           "max_total_num_tokens":500000,"token_usage":0.08,"gen_throughput":812.4,"cache_hit_rate":0.55,"utilization":0.08,
           "max_running_requests":256,"num_total_reqs":7,
           "disaggregation":{"mode":"decode","prefill_prealloc_queue_reqs":0,"prefill_inflight_queue_reqs":0,"decode_prealloc_queue_reqs":1,
                             "decode_transfer_queue_reqs":2,"decode_retracted_queue_reqs":0,"kv_transfer_speed_gb_s":21.3,"kv_transfer_latency_ms":7.9}},
          {"dp_rank":1,"num_running_reqs":4,"num_waiting_reqs":0,"num_used_tokens":30000,"num_total_tokens":30000,
           "max_total_num_tokens":500000,"token_usage":0.06,"num_total_reqs":4}],
 "aggregate":{"total_running_reqs":9,"total_waiting_reqs":2,"total_reqs":11,"avg_token_usage":0.07,"avg_throughput":790.1,"avg_utilization":0.07}}`

func TestParseLoads(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []Rank
		wantErr error // checked with errors.Is when set
		anyErr  bool
	}{
		{
			name: "sglang example",
			body: sglangLoadsExample,
			want: []Rank{
				{Rank: 0, UsedTokens: 40960, TotalTokens: 45056, MaxTotalTokens: 500000, Running: 5, Waiting: 2, KVUsage: 0.08, HasTokens: true},
				{Rank: 1, UsedTokens: 30000, TotalTokens: 30000, MaxTotalTokens: 500000, Running: 4, KVUsage: 0.06, HasTokens: true},
			},
		},
		{
			name: "unsorted ranks are sorted",
			body: `{"loads":[{"dp_rank":2,"num_used_tokens":3},{"dp_rank":0,"num_used_tokens":1},{"dp_rank":1,"num_used_tokens":2}]}`,
			want: []Rank{
				{Rank: 0, UsedTokens: 1, TotalTokens: 1, HasTokens: true},
				{Rank: 1, UsedTokens: 2, TotalTokens: 2, HasTokens: true},
				{Rank: 2, UsedTokens: 3, TotalTokens: 3, HasTokens: true},
			},
		},
		{
			name: "duplicate ranks summed",
			body: `{"loads":[
				{"dp_rank":0,"num_running_reqs":1,"num_waiting_reqs":2,"num_used_tokens":100,"num_total_tokens":150,"max_total_num_tokens":1000,"token_usage":0.1},
				{"dp_rank":1,"num_running_reqs":7,"num_used_tokens":5,"max_total_num_tokens":1000,"token_usage":0.005},
				{"dp_rank":0,"num_running_reqs":3,"num_waiting_reqs":4,"num_used_tokens":200,"num_total_tokens":260,"max_total_num_tokens":2000,"token_usage":0.3}]}`,
			want: []Rank{
				{Rank: 0, UsedTokens: 300, TotalTokens: 410, MaxTotalTokens: 2000, Running: 4, Waiting: 6, KVUsage: 0.3, HasTokens: true},
				{Rank: 1, UsedTokens: 5, TotalTokens: 5, MaxTotalTokens: 1000, Running: 7, KVUsage: 0.005, HasTokens: true},
			},
		},
		{
			name: "duplicate with and without total",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":100,"num_total_tokens":150},{"dp_rank":0,"num_used_tokens":10}]}`,
			want: []Rank{{Rank: 0, UsedTokens: 110, TotalTokens: 160, HasTokens: true}},
		},
		{
			name: "missing num_total_tokens falls back to used",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":4096,"max_total_num_tokens":8192,"token_usage":0.5}]}`,
			want: []Rank{{Rank: 0, UsedTokens: 4096, TotalTokens: 4096, MaxTotalTokens: 8192, KVUsage: 0.5, HasTokens: true}},
		},
		{
			name: "missing token_usage computed from capacity",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":250,"max_total_num_tokens":1000}]}`,
			want: []Rank{{Rank: 0, UsedTokens: 250, TotalTokens: 250, MaxTotalTokens: 1000, KVUsage: 0.25, HasTokens: true}},
		},
		{
			name: "missing dp_rank uses index",
			body: `{"loads":[{"num_used_tokens":1},{"num_used_tokens":2,"dp_rank":null}]}`,
			want: []Rank{
				{Rank: 0, UsedTokens: 1, TotalTokens: 1, HasTokens: true},
				{Rank: 1, UsedTokens: 2, TotalTokens: 2, HasTokens: true},
			},
		},
		{
			name: "total below used raised to used",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":100,"num_total_tokens":10}]}`,
			want: []Rank{{Rank: 0, UsedTokens: 100, TotalTokens: 100, HasTokens: true}},
		},
		{
			name: "no token counts",
			body: `{"loads":[{"dp_rank":0,"num_running_reqs":3,"token_usage":0.2}]}`,
			want: []Rank{{Rank: 0, Running: 3, KVUsage: 0.2}},
		},
		{
			name: "hostile numbers clamped",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":-5,"num_total_tokens":1e400,"max_total_num_tokens":-1,
				"num_running_reqs":1e30,"num_waiting_reqs":-3,"token_usage":7.5}]}`,
			want: []Rank{{Rank: 0, UsedTokens: 0, TotalTokens: maxTokens, Running: maxCount, KVUsage: 1, HasTokens: true}},
		},
		{
			name: "saturating sum",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":1e300,"num_running_reqs":1e300},{"dp_rank":0,"num_used_tokens":1e300,"num_running_reqs":1e300}]}`,
			want: []Rank{{Rank: 0, UsedTokens: maxTokens, TotalTokens: maxTokens, Running: maxCount, HasTokens: true}},
		},
		{
			name: "strings and booleans ignored",
			body: `{"loads":[{"dp_rank":0,"num_used_tokens":"12","num_running_reqs":true,"token_usage":"0.5"}]}`,
			want: []Rank{{Rank: 0}},
		},
		{
			name: "invalid dp_rank entries skipped",
			body: `{"loads":[{"dp_rank":-1,"num_used_tokens":1},{"dp_rank":1.5,"num_used_tokens":2},{"dp_rank":"x","num_used_tokens":3},
				{"dp_rank":1e12,"num_used_tokens":4},{"dp_rank":3,"num_used_tokens":5}]}`,
			want: []Rank{{Rank: 3, UsedTokens: 5, TotalTokens: 5, HasTokens: true}},
		},
		{name: "all entries invalid", body: `{"loads":[{"dp_rank":-1}]}`, wantErr: ErrNoLoads},
		{name: "empty loads", body: `{"loads":[]}`, wantErr: ErrNoLoads},
		{name: "no loads", body: `{"version":"0.5.19"}`, wantErr: ErrNoLoads},
		{name: "loads not an array", body: `{"loads":{"dp_rank":0}}`, wantErr: ErrNoLoads},
		{name: "top-level array", body: `[{"dp_rank":0}]`, wantErr: ErrNoLoads},
		{name: "entry not an object", body: `{"loads":[1]}`, anyErr: true},
		{name: "deeply nested array", body: strings.Repeat("[", maxBodyBytes), anyErr: true},
		{name: "deeply nested entry", body: `{"loads":[` + strings.Repeat(`{"a":`, 1<<20), anyErr: true},
		{
			name: "nesting at the limit is parsed",
			body: `{"loads":[{"dp_rank":0,"x":` + strings.Repeat("[", maxJSONDepth-3) + strings.Repeat("]", maxJSONDepth-3) + `}]}`,
			want: []Rank{{Rank: 0}},
		},
		{
			name: "many entries",
			body: `{"loads":[` + strings.Repeat(`{"num_used_tokens":1,"dp_rank":7},`, 200000) + `{"dp_rank":7}]}`,
			want: []Rank{{Rank: 7, UsedTokens: 200000, TotalTokens: 200000, HasTokens: true}},
		},
		{name: "invalid JSON", body: `{"loads":[`, anyErr: true},
		{name: "empty body", body: ``, anyErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLoads([]byte(tt.body))
			if tt.wantErr != nil || tt.anyErr {
				if err == nil {
					t.Fatalf("ParseLoads() = %+v, want error", got)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseLoads() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseLoads() error = %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseLoads() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}
