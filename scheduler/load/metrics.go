package load

import (
	"fmt"
	"io"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Name prefixes SGLang load gauges are found under: the engine itself uses
// "sglang:", while /v1/loads?format=prometheus, old router aggregation and
// Prometheus-side renaming produce "sglang_". When a gauge exists under
// both, the colon one wins.
const (
	sglangColon      = "sglang:"
	sglangUnderscore = "sglang_"
)

// gauge says how one load gauge feeds an accumulator. names are tried in
// order; the first family present is used and the others are ignored, so
// that one quantity is never counted twice.
type gauge struct {
	names []string
	add   func(a *accum, v float64)
}

// sglangGauges lists the SGLang gauges ParseMetrics reads. num_waiting_reqs
// and num_total_tokens are the names /v1/loads?format=prometheus uses.
func sglangGauges() []gauge {
	gs := []gauge{
		{[]string{"num_used_tokens"}, func(a *accum, v float64) { a.addUsed(tokens(v)) }},
		{[]string{"num_total_tokens"}, func(a *accum, v float64) { a.addTotal(tokens(v)) }},
		{[]string{"max_total_num_tokens"}, func(a *accum, v float64) { a.setMax(tokens(v)) }},
		{[]string{"num_running_reqs"}, func(a *accum, v float64) { a.addRunning(count(v)) }},
		{[]string{"num_queue_reqs", "num_waiting_reqs"}, func(a *accum, v float64) { a.addWaiting(count(v)) }},
		{[]string{"token_usage"}, func(a *accum, v float64) { a.setUsage(ratio(v)) }},
	}
	for i := range gs {
		gs[i].names = withPrefixes(gs[i].names)
	}
	return gs
}

// vllmGauges lists the vLLM gauges ParseMetrics reads, in the same form.
func vllmGauges() []gauge {
	return []gauge{
		{[]string{"vllm:num_requests_running"}, func(a *accum, v float64) { a.addRunning(count(v)) }},
		{[]string{"vllm:num_requests_waiting"}, func(a *accum, v float64) { a.addWaiting(count(v)) }},
		{[]string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, func(a *accum, v float64) { a.setUsage(ratio(v)) }},
	}
}

// ParseMetrics parses a Prometheus text exposition from an engine's
// GET /metrics and returns one Rank per DP rank, sorted by rank, together
// with the source: SourceMetricsSGLang or SourceMetricsVLLM.
//
// SGLang gauges (prefix "sglang:" or "sglang_") are num_used_tokens,
// num_running_reqs, num_queue_reqs (Waiting), token_usage and, when present,
// max_total_num_tokens; the rank is the "dp_rank" label, 0 when absent.
// vLLM gauges are vllm:num_requests_running, vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc (or the older vllm:gpu_cache_usage_perc); the
// rank is the "engine" label and HasTokens is false. SGLang wins when both
// are present. Series for the same rank (differing in tp_rank, pid or other
// labels) are summed; for usage and capacity the largest value is kept.
// Series whose rank label is not a whole number in range are skipped.
// ErrNoLoadMetrics is returned when neither engine's gauges are found.
func ParseMetrics(r io.Reader) ([]Rank, string, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, "", fmt.Errorf("parse /metrics: %w", err)
	}
	if set, found := collect(families, sglangGauges(), "dp_rank"); found {
		return finish(set, SourceMetricsSGLang)
	}
	if set, found := collect(families, vllmGauges(), "engine"); found {
		return finish(set, SourceMetricsVLLM)
	}
	return nil, "", fmt.Errorf("parse /metrics: %w", ErrNoLoadMetrics)
}

// withPrefixes expands SGLang base names into full names, trying every
// prefix for the first base name before the next base name.
func withPrefixes(bases []string) []string {
	out := make([]string, 0, 2*len(bases))
	for _, b := range bases {
		out = append(out, sglangColon+b, sglangUnderscore+b)
	}
	return out
}

// finish turns a collected rank set into ParseMetrics' result.
func finish(set rankSet, source string) ([]Rank, string, error) {
	if len(set) == 0 {
		return nil, "", fmt.Errorf("parse /metrics: %w: no series with a valid rank", ErrNoLoadMetrics)
	}
	return set.ranks(), source, nil
}

// collect feeds every series of the given gauges into a rank set keyed by
// rankLabel. found is false when none of the gauges' families exists.
func collect(families map[string]*dto.MetricFamily, gauges []gauge, rankLabel string) (set rankSet, found bool) {
	set = rankSet{}
	for _, g := range gauges {
		fam := firstFamily(families, g.names)
		if fam == nil {
			continue
		}
		found = true
		for _, m := range fam.GetMetric() {
			v, ok := sampleValue(m)
			if !ok {
				continue
			}
			rank, ok := labelRank(m, rankLabel)
			if !ok {
				continue
			}
			g.add(set.get(rank), v)
		}
	}
	return set, found
}

// firstFamily returns the first of names present in families, or nil.
func firstFamily(families map[string]*dto.MetricFamily, names []string) *dto.MetricFamily {
	for _, n := range names {
		if f, ok := families[n]; ok {
			return f
		}
	}
	return nil
}

// sampleValue returns the value of a gauge, counter or untyped sample.
func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

// labelRank returns the rank in label name of m: 0 when the label is absent
// or empty, and ok false when it is not a whole number in 0..maxRank.
func labelRank(m *dto.Metric, name string) (rank int, ok bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() != name || lp.GetValue() == "" {
			continue
		}
		n, err := strconv.Atoi(lp.GetValue())
		if err != nil || n < 0 || n > maxRank {
			return 0, false
		}
		return n, true
	}
	return 0, true
}
