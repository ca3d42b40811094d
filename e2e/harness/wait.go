package harness

import (
	"context"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Fataler is the part of a *testing.T that WaitFor uses.
type Fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// WaitFor polls cond every 20 ms until it holds, failing t after within.
func WaitFor(t Fataler, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SumMetric sums the samples (counter or gauge) of the metric family name
// in mfs whose labels include match.
func SumMetric(mfs map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	sum := 0.0
	for _, m := range mfs[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range match {
			ok = ok && labels[k] == v
		}
		if ok {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

// ReplicaMetric sums one metric of duet replica i (SumMetric), or returns
// -1 when the replica does not answer (it is dead, or restarting).
func (s *Stack) ReplicaMetric(i int, name string, match map[string]string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mfs, err := ScrapeMetrics(ctx, http.DefaultClient, s.DuetAdminURLs[i]+"/metrics")
	if err != nil {
		return -1
	}
	return SumMetric(mfs, name, match)
}
