package sim

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// family is one parsed metric family.
type family struct {
	typ     string
	samples model.Vector
}

// scrape fetches /metrics and parses it with expfmt.
func scrape(t *testing.T, ts *testServer) map[string]family {
	t.Helper()
	r := get(t, ts.api.URL+"/metrics")
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%s", err, r.body)
	}
	out := map[string]family{}
	for name, f := range fams {
		vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.Now()}, f)
		if err != nil {
			t.Fatalf("extract %s: %v", name, err)
		}
		out[name] = family{typ: f.GetType().String(), samples: vec}
	}
	return out
}

func TestMetricsExposition(t *testing.T) {
	gauges := []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
		"sglang:token_usage", "sglang:cache_hit_rate", "sglang:gen_throughput"}
	tests := []struct {
		name       string
		mode       Mode
		dp         int
		wantEngine string
		wantRanks  []string // dp_rank label values; nil: no dp_rank label
	}{
		{name: "decode dp4", mode: ModeDecode, dp: 4, wantEngine: "decode", wantRanks: []string{"0", "1", "2", "3"}},
		{name: "prefill dp2", mode: ModePrefill, dp: 2, wantEngine: "prefill", wantRanks: []string{"0", "1"}},
		{name: "unified dp1 has no dp_rank", mode: ModeNull, dp: 1, wantEngine: "unified"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startTest(t, Config{Mode: tc.mode, DPSize: tc.dp, Model: "m-x"})
			fams := scrape(t, ts)
			for _, name := range gauges {
				f, ok := fams[name]
				if !ok {
					t.Fatalf("missing %s", name)
				}
				if f.typ != "GAUGE" {
					t.Fatalf("%s is %v", name, f.typ)
				}
				var ranks []string
				for _, smp := range f.samples {
					l := smp.Metric
					if string(l["engine_type"]) != tc.wantEngine || l["model_name"] != "m-x" || l["tp_rank"] != "0" || l["pp_rank"] != "0" {
						t.Fatalf("%s labels %v", name, l)
					}
					if r, ok := l["dp_rank"]; ok {
						ranks = append(ranks, string(r))
					}
				}
				if len(f.samples) != tc.dp || strings.Join(ranks, ",") != strings.Join(tc.wantRanks, ",") {
					t.Fatalf("%s: %d series, dp_rank labels %v, want %v", name, len(f.samples), ranks, tc.wantRanks)
				}
			}
		})
	}
}

func TestMetricsAreLive(t *testing.T) {
	ts := startTest(t, Config{Mode: ModeNull, DPSize: 2, DecodePerToken: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		postCtx(ctx, t, ts.api.URL+"/generate", `{"input_ids":[1,2,3,4,5,6,7],"routed_dp_rank":1}`)
	}()
	value := func(fams map[string]family, name, rank string) float64 {
		for _, smp := range fams[name].samples {
			if string(smp.Metric["dp_rank"]) == rank {
				return float64(smp.Value)
			}
		}
		t.Fatalf("%s has no dp_rank=%s", name, rank)
		return 0
	}
	var fams map[string]family
	eventually(t, "running on rank 1", func() bool {
		fams = scrape(t, ts)
		return value(fams, "sglang:num_running_reqs", "1") == 1
	})
	if value(fams, "sglang:num_used_tokens", "1") != 7 || value(fams, "sglang:num_running_reqs", "0") != 0 {
		t.Fatalf("unexpected values")
	}
	cancel()
	<-done
}

// The tokenizer-level counters add up finished requests; repeating a prompt
// under the engine model counts its cached tokens.
func TestTokenCounters(t *testing.T) {
	ts := startTest(t, Config{Profile: "dense-8b-h100", TimeScale: 50})
	body := `{"model":"sim-model","prompt":"` + strings.Repeat("the same long prefix ", 200) + `","max_tokens":3}`
	for range 2 {
		if r := post(t, ts.api.URL+"/v1/completions", body); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	text := string(get(t, ts.api.URL+"/metrics").body)
	values := map[string]float64{}
	for _, name := range []string{"sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:generation_tokens_total"} {
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, name+"{") {
				var v float64
				fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
				values[name] = v
			}
		}
	}
	if values["sglang:generation_tokens_total"] != 6 || values["sglang:prompt_tokens_total"] < 1000 {
		t.Errorf("counters = %v", values)
	}
	if c := values["sglang:cached_tokens_total"]; c <= 0 || c >= values["sglang:prompt_tokens_total"] {
		t.Errorf("cached tokens %v of %v prompt tokens: the repeated prefix was not counted", c, values["sglang:prompt_tokens_total"])
	}
}

// sglangPDQueueGauges are SGLang 0.5.23's PD queue gauges and their help
// (metrics_collector.py SchedulerMetricsCollector). It has none for the
// decode's retracted queue.
var sglangPDQueueGauges = map[string]string{
	"sglang:num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
	"sglang:num_prefill_inflight_queue_reqs":  "The number of requests in the prefill inflight queue.",
	"sglang:num_decode_prealloc_queue_reqs":   "The number of requests in the decode prealloc queue.",
	"sglang:num_decode_transfer_queue_reqs":   "The number of requests in the decode transfer queue.",
}

// pdQueueGaugeName matches the name of any PD queue gauge.
var pdQueueGaugeName = regexp.MustCompile(`^sglang:num_(prefill|decode)_[a-z]+_queue_reqs$`)

// Every server exports exactly SGLang 0.5.23's four PD queue gauges, with
// its help and the labels of the other scheduler gauges, 0 while idle.
func TestMetricsPDQueueGauges(t *testing.T) {
	tests := []struct {
		mode Mode
		dp   int
	}{
		{mode: ModePrefill, dp: 2},
		{mode: ModeDecode, dp: 1},
		{mode: ModeNull, dp: 1},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			ts := startTest(t, Config{Mode: tc.mode, DPSize: tc.dp, Model: "m-x"})
			r := get(t, ts.api.URL+"/metrics")
			p := expfmt.NewTextParser(model.LegacyValidation)
			fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
			if err != nil {
				t.Fatalf("parse metrics: %v", err)
			}
			var names []string
			for name := range fams {
				if pdQueueGaugeName.MatchString(name) {
					names = append(names, name)
				}
			}
			sort.Strings(names)
			if want := slices.Sorted(maps.Keys(sglangPDQueueGauges)); !slices.Equal(names, want) {
				t.Fatalf("PD queue gauges %v, want SGLang 0.5.23's %v", names, want)
			}
			labelNames := func(name string) string {
				var out []string
				for _, l := range fams[name].GetMetric()[0].GetLabel() {
					out = append(out, l.GetName())
				}
				return strings.Join(out, ",")
			}
			for name, help := range sglangPDQueueGauges {
				f := fams[name]
				if f.GetHelp() != help || f.GetType().String() != "GAUGE" || len(f.GetMetric()) != tc.dp {
					t.Fatalf("%s: %v %q with %d samples, want a gauge %q with %d", name, f.GetType(), f.GetHelp(), len(f.GetMetric()), help, tc.dp)
				}
				if got, want := labelNames(name), labelNames("sglang:num_running_reqs"); got != want {
					t.Fatalf("%s labels %s, want %s", name, got, want)
				}
				for _, m := range f.GetMetric() {
					if m.GetGauge().GetValue() != 0 {
						t.Fatalf("%s = %v while idle", name, m.GetGauge().GetValue())
					}
				}
			}
		})
	}
}
