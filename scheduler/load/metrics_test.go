package load

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sglangMetricsExample is the SGLang exposition from the protocol notes,
// with a second rank's queue, tokens and usage added.
const sglangMetricsExample = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 37.0
sglang:num_running_reqs{dp_rank="1",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="1",pp_rank="0",tp_rank="1"} 35.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
sglang:num_queue_reqs{dp_rank="1",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="1",pp_rank="0",tp_rank="1"} 4.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 81234.0
sglang:num_used_tokens{dp_rank="1",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="1",pp_rank="0",tp_rank="1"} 70000.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.41
sglang:token_usage{dp_rank="1",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="1",pp_rank="0",tp_rank="1"} 0.35
# HELP sglang:cache_hit_rate The cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.62
# HELP sglang:num_decode_transfer_queue_reqs The number of requests in the decode transfer queue.
# TYPE sglang:num_decode_transfer_queue_reqs gauge
sglang:num_decode_transfer_queue_reqs{dp_rank="0",engine_type="decode",model_name="deepseek-r1",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
`

// vllmMetricsExample is the vLLM exposition from the protocol notes, with
// the second engine's queue and usage added.
const vllmMetricsExample = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.37
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
`

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name       string
		text       string
		want       []Rank
		wantSource string
		wantErr    error // checked with errors.Is when set
		anyErr     bool
	}{
		{
			name:       "sglang colon prefix",
			text:       sglangMetricsExample,
			wantSource: SourceMetricsSGLang,
			want: []Rank{
				{Rank: 0, UsedTokens: 81234, TotalTokens: 81234, Running: 37, KVUsage: 0.41, HasTokens: true},
				{Rank: 1, UsedTokens: 70000, TotalTokens: 70000, Running: 35, Waiting: 4, KVUsage: 0.35, HasTokens: true},
			},
		},
		{
			name:       "sglang underscore prefix",
			text:       strings.ReplaceAll(sglangMetricsExample, "sglang:", "sglang_"),
			wantSource: SourceMetricsSGLang,
			want: []Rank{
				{Rank: 0, UsedTokens: 81234, TotalTokens: 81234, Running: 37, KVUsage: 0.41, HasTokens: true},
				{Rank: 1, UsedTokens: 70000, TotalTokens: 70000, Running: 35, Waiting: 4, KVUsage: 0.35, HasTokens: true},
			},
		},
		{
			name: "colon wins over underscore for the same gauge",
			text: `sglang:num_running_reqs{dp_rank="0"} 5
sglang_num_running_reqs{dp_rank="0"} 5
sglang_num_used_tokens{dp_rank="0"} 100
`,
			wantSource: SourceMetricsSGLang,
			want:       []Rank{{Rank: 0, UsedTokens: 100, TotalTokens: 100, Running: 5, HasTokens: true}},
		},
		{
			name: "v1/loads prometheus format names",
			text: `sglang_num_waiting_reqs{dp_rank="0"} 3
sglang_num_used_tokens{dp_rank="0"} 100
sglang_num_total_tokens{dp_rank="0"} 180
sglang_max_total_num_tokens{dp_rank="0"} 1000
`,
			wantSource: SourceMetricsSGLang,
			want:       []Rank{{Rank: 0, UsedTokens: 100, TotalTokens: 180, MaxTotalTokens: 1000, Waiting: 3, KVUsage: 0.1, HasTokens: true}},
		},
		{
			name: "tp_rank series summed per dp_rank",
			text: `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 3
sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 4
sglang:num_running_reqs{dp_rank="1",tp_rank="2"} 5
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",tp_rank="0",pid="11"} 1
sglang:num_queue_reqs{dp_rank="0",tp_rank="1",pid="12"} 2
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{dp_rank="0",tp_rank="0"} 1000
sglang:num_used_tokens{dp_rank="0",tp_rank="1"} 500
sglang:num_used_tokens{dp_rank="1",tp_rank="2"} 10
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",tp_rank="0"} 0.2
sglang:token_usage{dp_rank="0",tp_rank="1"} 0.3
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",tp_rank="0"} 5000
sglang:max_total_num_tokens{dp_rank="0",tp_rank="1"} 4000
sglang:max_total_num_tokens{dp_rank="1",tp_rank="2"} 100
`,
			wantSource: SourceMetricsSGLang,
			want: []Rank{
				{Rank: 0, UsedTokens: 1500, TotalTokens: 1500, MaxTotalTokens: 5000, Running: 7, Waiting: 3, KVUsage: 0.3, HasTokens: true},
				{Rank: 1, UsedTokens: 10, TotalTokens: 10, MaxTotalTokens: 100, Running: 5, KVUsage: 0.1, HasTokens: true},
			},
		},
		{
			name: "no dp_rank label is rank 0",
			text: `# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"} 2
sglang:num_used_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct",dp_rank=""} 64
`,
			wantSource: SourceMetricsSGLang,
			want:       []Rank{{Rank: 0, UsedTokens: 64, TotalTokens: 64, Running: 2, KVUsage: 0.28, HasTokens: true}},
		},
		{
			name: "untyped, counter and other types",
			text: `sglang:num_running_reqs{dp_rank="0"} 2
# TYPE sglang:num_queue_reqs counter
sglang:num_queue_reqs{dp_rank="0"} 1
# TYPE sglang:num_used_tokens histogram
sglang:num_used_tokens_bucket{dp_rank="0",le="+Inf"} 1
sglang:num_used_tokens_sum{dp_rank="0"} 1
sglang:num_used_tokens_count{dp_rank="0"} 1
`,
			wantSource: SourceMetricsSGLang,
			want:       []Rank{{Rank: 0, Running: 2, Waiting: 1}},
		},
		{
			name: "hostile values and labels",
			text: `sglang:num_running_reqs{dp_rank="0"} NaN
sglang:num_queue_reqs{dp_rank="0"} -4
sglang:num_used_tokens{dp_rank="0"} +Inf
sglang:token_usage{dp_rank="0"} 12
sglang:num_running_reqs{dp_rank="1"} 1e300
sglang:token_usage{dp_rank="1"} -Inf
sglang:num_running_reqs{dp_rank="x"} 9
sglang:num_running_reqs{dp_rank="1.0"} 9
sglang:num_running_reqs{dp_rank="-1"} 9
sglang:num_running_reqs{dp_rank="99999999999999999999"} 9
sglang:num_running_reqs{dp_rank="4096"} 9
`,
			wantSource: SourceMetricsSGLang,
			want: []Rank{
				{Rank: 0, UsedTokens: maxTokens, TotalTokens: maxTokens, KVUsage: 1, HasTokens: true},
				{Rank: 1, Running: maxCount},
			},
		},
		{
			name:       "vllm keyed by engine",
			text:       vllmMetricsExample,
			wantSource: SourceMetricsVLLM,
			want: []Rank{
				{Rank: 0, Running: 12, KVUsage: 0.37},
				{Rank: 1, Running: 9, Waiting: 2, KVUsage: 0.25},
			},
		},
		{
			name: "vllm old usage name and no engine label",
			text: `vllm:num_requests_running{model_name="m"} 3
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
`,
			wantSource: SourceMetricsVLLM,
			want:       []Rank{{Rank: 0, Running: 3, KVUsage: 0.5}},
		},
		{
			name: "vllm new usage name wins",
			text: `vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:gpu_cache_usage_perc{engine="0"} 0.9
`,
			wantSource: SourceMetricsVLLM,
			want:       []Rank{{Rank: 0, KVUsage: 0.2}},
		},
		{
			name: "sglang wins over vllm",
			text: `vllm:num_requests_running{engine="0"} 3
sglang:num_running_reqs 4
`,
			wantSource: SourceMetricsSGLang,
			want:       []Rank{{Rank: 0, Running: 4}},
		},
		{
			name:    "unknown metrics",
			text:    "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nsglang:cache_hit_rate 0.5\n",
			wantErr: ErrNoLoadMetrics,
		},
		{name: "empty", text: "", wantErr: ErrNoLoadMetrics},
		{name: "only invalid ranks", text: `sglang:num_running_reqs{dp_rank="a"} 1` + "\n", wantErr: ErrNoLoadMetrics},
		{name: "malformed", text: "sglang:num_running_reqs{dp_rank=\"0\" 1\n", anyErr: true},
		{name: "json", text: sglangLoadsExample, anyErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, source, err := ParseMetrics(strings.NewReader(tt.text))
			if tt.wantErr != nil || tt.anyErr {
				if err == nil {
					t.Fatalf("ParseMetrics() = %+v, %q, want error", got, source)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseMetrics() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMetrics() error = %v", err)
			}
			if source != tt.wantSource {
				t.Errorf("ParseMetrics() source = %q, want %q", source, tt.wantSource)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseMetrics() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}
