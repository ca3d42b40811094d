package load

import (
	"bytes"
	"math"
	"testing"
)

// checkRanks fails t unless ranks satisfy what both parsers promise.
func checkRanks(t *testing.T, ranks []Rank) {
	t.Helper()
	if len(ranks) == 0 {
		t.Fatalf("no ranks without an error")
	}
	for i, r := range ranks {
		if i > 0 && r.Rank <= ranks[i-1].Rank {
			t.Fatalf("ranks not strictly increasing: %+v", ranks)
		}
		if r.Rank < 0 || r.Rank > maxRank {
			t.Fatalf("rank out of range: %+v", r)
		}
		if r.UsedTokens < 0 || r.UsedTokens > maxTokens || r.TotalTokens < r.UsedTokens || r.TotalTokens > maxTokens ||
			r.MaxTotalTokens < 0 || r.MaxTotalTokens > maxTokens || r.Running < 0 || r.Running > maxCount ||
			r.Waiting < 0 || r.Waiting > maxCount || math.IsNaN(r.KVUsage) || r.KVUsage < 0 || r.KVUsage > 1 {
			t.Fatalf("value out of range: %+v", r)
		}
		if !r.HasTokens && r.UsedTokens != 0 {
			t.Fatalf("used tokens without HasTokens: %+v", r)
		}
	}
}

func FuzzParseLoads(f *testing.F) {
	for _, seed := range []string{
		sglangLoadsExample,
		`{"loads":[]}`,
		`{"loads":[{"dp_rank":0,"num_used_tokens":1e400,"num_total_tokens":-1e400,"token_usage":-0.0}]}`,
		`{"loads":[{"dp_rank":0,"num_used_tokens":9007199254740993},{"dp_rank":0,"num_used_tokens":9007199254740993}]}`,
		`{"loads":[{"dp_rank":1e308},{"dp_rank":-0},{"dp_rank":"0"},{"dp_rank":[0]},{"dp_rank":{"a":1}},null,[],"x"]}`,
		`{"loads":[{"num_running_reqs":2147483648,"num_waiting_reqs":2147483647},{"dp_rank":0,"num_waiting_reqs":2147483647}]}`,
		`{"loads":[{"dp_rank":0}],"loads":[{"dp_rank":1}]}`,
		`{"lo\u0061ds":[{"dp_rank":0}]}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		"\xff\xfe{}",
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ranks, err := ParseLoads(body)
		if err != nil {
			if ranks != nil {
				t.Fatalf("ranks %+v with error %v", ranks, err)
			}
			return
		}
		checkRanks(t, ranks)
	})
}

func FuzzParseMetrics(f *testing.F) {
	for _, seed := range []string{
		sglangMetricsExample,
		vllmMetricsExample,
		"sglang:num_running_reqs NaN\nsglang:token_usage +Inf\nsglang:num_used_tokens -Inf\n",
		"sglang_num_used_tokens{dp_rank=\"1e3\"} 1e308\nsglang_num_used_tokens{dp_rank=\"1\"} 1e308\nsglang_num_used_tokens{dp_rank=\"1\"} 1e308\n",
		"vllm:num_requests_running{engine=\"-0\"} 1\nvllm:num_requests_running{engine=\"+1\"} 1\nvllm:num_requests_running{engine=\"٣\"} 1\n",
		"# TYPE sglang:num_running_reqs summary\nsglang:num_running_reqs{quantile=\"0.5\"} 1\nsglang:num_running_reqs_sum 1\nsglang:num_running_reqs_count 1\n",
		"{\"sglang:num_running_reqs\",dp_rank=\"0\"} 3\n",
		"# TYPE sglang:num_running_reqs gauge\n# TYPE sglang:num_running_reqs gauge\n",
		"sglang:num_running_reqs{dp_rank=\"0\"} 1 1700000000000\n",
		"sglang:num_running_reqs{dp_rank=\"0\"} 1",
		"\x00\xff",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		ranks, source, err := ParseMetrics(bytes.NewReader(text))
		if err != nil {
			if ranks != nil || source != "" {
				t.Fatalf("ranks %+v, source %q with error %v", ranks, source, err)
			}
			return
		}
		if source != SourceMetricsSGLang && source != SourceMetricsVLLM {
			t.Fatalf("source = %q", source)
		}
		checkRanks(t, ranks)
		if source == SourceMetricsVLLM {
			for _, r := range ranks {
				if r.HasTokens {
					t.Fatalf("vLLM rank with tokens: %+v", r)
				}
			}
		}
	})
}
