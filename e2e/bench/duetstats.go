package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/duet-router/duet/e2e/harness"
)

// DuetStats are what duet's process and its metrics say of one case.
type DuetStats struct {
	// CPUSeconds is duet's CPU time (user and system, every thread)
	// during the measured window, in wall seconds; negative when it could
	// not be read.
	CPUSeconds float64 `json:"cpu_s"`
	// WindowSeconds is the measured window's wall length, for CPUSeconds.
	WindowSeconds float64 `json:"window_wall_s"`
	// Tokenized counts duet_tokenize_requests_total by outcome over the
	// whole case (warm-up included): empty without a tokenizer.
	Tokenized map[string]float64 `json:"tokenized,omitempty"`
	// KVEventStates counts the (engine, rank) targets by their KV event
	// view at the case's end (duet_kv_events_state: live, warming,
	// fallback): empty when duet follows no events.
	KVEventStates map[string]int `json:"kv_event_states,omitempty"`
	// KVEvents is the KV events duet received (duet_kv_events_total),
	// and KVFallbacks the times a target fell back to the estimate
	// (duet_kv_events_fallbacks_total), over the whole case.
	KVEvents    float64 `json:"kv_events,omitempty"`
	KVFallbacks float64 `json:"kv_event_fallbacks,omitempty"`
	// Admission counts duet_admission_requests_total by "class/outcome"
	// (admitted, queued_admitted, wait_limit, queue_full, shed, ...) and
	// AdmissionTenants by "class/tenant", over the whole case (warm-up
	// included): how duet classed and judged the requests. Empty with the
	// queue off.
	Admission        map[string]float64 `json:"admission,omitempty"`
	AdmissionTenants map[string]float64 `json:"admission_tenants,omitempty"`
}

// CPUPerRequestMs is duet's CPU time per request of the window, in wall
// milliseconds (negative when unknown).
func (d DuetStats) CPUPerRequestMs(requests int) float64 {
	if d.CPUSeconds < 0 || requests <= 0 {
		return -1
	}
	return d.CPUSeconds * 1000 / float64(requests)
}

// Cores is duet's CPU time over the window's wall time: the cores it kept
// busy on average (negative when unknown).
func (d DuetStats) Cores() float64 {
	if d.CPUSeconds < 0 || d.WindowSeconds <= 0 {
		return -1
	}
	return d.CPUSeconds / d.WindowSeconds
}

// line renders d for a progress line.
func (d DuetStats) line(requests int) string {
	s := fmt.Sprintf("cpu %.2fs in the window (%.2f cores, %.2f ms/request)", d.CPUSeconds, d.Cores(), d.CPUPerRequestMs(requests))
	if len(d.Tokenized) > 0 {
		s += "; tokenized " + formatCounts(d.Tokenized)
	}
	if len(d.KVEventStates) > 0 {
		counts := map[string]float64{}
		for k, v := range d.KVEventStates {
			counts[k] = float64(v)
		}
		s += fmt.Sprintf("; kv event targets %s, %.0f events, %.0f fallbacks", formatCounts(counts), d.KVEvents, d.KVFallbacks)
	}
	if len(d.Admission) > 0 {
		s += "; admission " + formatCounts(d.Admission)
	}
	return s
}

// formatCounts renders counts as "k=v" pairs in key order.
func formatCounts(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// readCPUAt reads p's CPU time at wall time at; the channel yields a
// negative duration when it could not (ctx ended first, or no /proc).
func readCPUAt(ctx context.Context, p *harness.Process, at time.Time) <-chan time.Duration {
	return readAt(ctx, at, -1, func() time.Duration {
		d, err := p.CPUTime()
		if err != nil {
			return -1
		}
		return d
	})
}

// readDuetStats waits for the CPU readings of the window's ends (window
// apart, wall time) and reads duet's metrics (first replica).
func readDuetStats(ctx context.Context, stack *harness.Stack, window time.Duration, before, after <-chan time.Duration) *DuetStats {
	b, a := <-before, <-after
	d := &DuetStats{CPUSeconds: -1, WindowSeconds: window.Seconds()}
	if b >= 0 && a >= b {
		d.CPUSeconds = (a - b).Seconds()
	}
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fams, err := stack.DuetMetrics(mctx)
	if err != nil {
		return d
	}
	d.Tokenized = sumByLabel(fams["duet_tokenize_requests_total"], "outcome")
	d.KVEvents = sumAll(fams["duet_kv_events_total"])
	d.KVFallbacks = sumAll(fams["duet_kv_events_fallbacks_total"])
	d.Admission = sumByLabels(fams["duet_admission_requests_total"], "class", "outcome")
	d.AdmissionTenants = sumByLabels(fams["duet_admission_requests_total"], "class", "tenant")
	if f := fams["duet_kv_events_state"]; f != nil {
		d.KVEventStates = map[string]int{}
		names := map[float64]string{0: "fallback", 1: "warming", 2: "live"}
		for _, m := range f.GetMetric() {
			name, ok := names[m.GetGauge().GetValue()]
			if !ok {
				name = fmt.Sprint(m.GetGauge().GetValue())
			}
			d.KVEventStates[name]++
		}
	}
	return d
}

// value is a counter's or gauge's value.
func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// sumAll sums every series of f (0 for nil).
func sumAll(f *dto.MetricFamily) float64 {
	total := 0.0
	for _, m := range f.GetMetric() {
		total += value(m)
	}
	return total
}

// sumByLabel sums f's series by their label's value (nil for nil).
func sumByLabel(f *dto.MetricFamily, label string) map[string]float64 {
	return sumByLabels(f, label)
}

// sumByLabels sums f's series by their labels' values, joined by "/"
// (nil for nil, or when no series has every label).
func sumByLabels(f *dto.MetricFamily, labels ...string) map[string]float64 {
	var out map[string]float64
	for _, m := range f.GetMetric() {
		values := make([]string, len(labels))
		found := 0
		for _, l := range m.GetLabel() {
			if i := slices.Index(labels, l.GetName()); i >= 0 {
				values[i] = l.GetValue()
				found++
			}
		}
		if found < len(labels) {
			continue
		}
		if out == nil {
			out = map[string]float64{}
		}
		out[strings.Join(values, "/")] += value(m)
	}
	return out
}
