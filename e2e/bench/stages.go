package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/duet-router/duet/e2e/harness"
)

// StageMetric is SGLang's per-stage request latency histogram, in
// seconds, labelled by stage; duet-sim exports it in model seconds.
const StageMetric = "sglang:per_stage_req_latency_seconds"

// stageOrder is the order of SGLang's stages in a request's life on a
// prefill and then a decode server; the report lists stages so.
var stageOrder = []string{
	"prefill_bootstrap", "prefill_waiting", "prefill_forward", "prefill_transfer_kv_cache",
	"decode_prepare", "decode_bootstrap", "decode_transferred", "decode_waiting",
}

// StageKey is one stage on the engines of one role.
type StageKey struct{ Role, Stage string }

// StageTotal is a stage histogram's sum (seconds) and observation count.
type StageTotal struct{ Sum, Count float64 }

// StageTotals are the stage histograms' sums and counts, each summed over
// the engines of its role (and their ranks).
type StageTotals map[StageKey]StageTotal

// StageLatency is the mean time requests spent in one stage on the engines
// of one role during a case's window.
type StageLatency struct {
	Role  string `json:"role"`
	Stage string `json:"stage"`
	// MeanMs is the stage's mean in model milliseconds (the histograms'
	// sum over their count).
	MeanMs float64 `json:"mean_ms"`
	// Count is the number of observations behind MeanMs.
	Count float64 `json:"count"`
}

// ReadStageTotals scrapes every engine's /metrics and sums StageMetric by
// role and stage. Engines that do not export it add nothing.
func ReadStageTotals(ctx context.Context, client *http.Client, engines []Engine) (StageTotals, error) {
	t := StageTotals{}
	for _, e := range engines {
		families, err := harness.ScrapeMetrics(ctx, client, e.URL+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("stage latencies of %s: %w", e.Name, err)
		}
		t.add(e.Role, families[StageMetric])
	}
	return t, nil
}

// add adds the histograms of f (nil: none) to t under role.
func (t StageTotals) add(role string, f *dto.MetricFamily) {
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		stage := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" {
				stage = l.GetValue()
			}
		}
		k := StageKey{Role: role, Stage: stage}
		v := t[k]
		v.Sum += h.GetSampleSum()
		v.Count += float64(h.GetSampleCount())
		t[k] = v
	}
}

// Sub returns t - before, stage by stage (a stage missing from before
// counts from zero).
func (t StageTotals) Sub(before StageTotals) StageTotals {
	out := StageTotals{}
	for k, v := range t {
		b := before[k]
		out[k] = StageTotal{Sum: v.Sum - b.Sum, Count: v.Count - b.Count}
	}
	return out
}

// Latencies returns the mean of every stage observed at least once, in
// model milliseconds, prefill role first, stages in stageOrder (others
// after, by name).
func (t StageTotals) Latencies() []StageLatency {
	var out []StageLatency
	for k, v := range t {
		if v.Count <= 0 {
			continue
		}
		out = append(out, StageLatency{Role: k.Role, Stage: k.Stage, MeanMs: v.Sum / v.Count * 1000, Count: v.Count})
	}
	slices.SortFunc(out, func(a, b StageLatency) int { return compareStages(a.key(), b.key()) })
	return out
}

// key is l's role and stage.
func (l StageLatency) key() StageKey { return StageKey{Role: l.Role, Stage: l.Stage} }

// compareStages orders stage keys by role (prefill, decode, others by
// name), then by stageOrder, then by name.
func compareStages(a, b StageKey) int {
	rank := func(list []string, s string) int {
		if i := slices.Index(list, s); i >= 0 {
			return i
		}
		return len(list)
	}
	roles := []string{RolePrefill, RoleDecode}
	return cmp.Or(
		cmp.Compare(rank(roles, a.Role), rank(roles, b.Role)), cmp.Compare(a.Role, b.Role),
		cmp.Compare(rank(stageOrder, a.Stage), rank(stageOrder, b.Stage)), cmp.Compare(a.Stage, b.Stage))
}

// readStagesAt reads the stage totals of engines at wall time at; the
// channel yields nil when ctx ended first or the scrape failed.
func readStagesAt(ctx context.Context, engines []Engine, at time.Time) <-chan StageTotals {
	return readAt(ctx, at, nil, func() StageTotals { return readStages(ctx, engines) })
}

// readStages reads the stage totals of engines now; nil when the scrape
// failed.
func readStages(ctx context.Context, engines []Engine) StageTotals {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t, err := ReadStageTotals(ctx, &http.Client{Timeout: 2 * time.Second}, engines)
	if err != nil {
		return nil
	}
	return t
}

// stageLatencies is the mean of each stage between two readings; nil when
// either is missing.
func stageLatencies(before, after StageTotals) []StageLatency {
	if before == nil || after == nil {
		return nil
	}
	return after.Sub(before).Latencies()
}
