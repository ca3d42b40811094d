package kvevents

import (
	"github.com/prometheus/client_golang/prometheus"
)

// trackerCollector exports a Tracker's per-rank counters at scrape time,
// so that ingesting an event costs no metric update.
type trackerCollector[K comparable] struct {
	t *Tracker[K]
}

// Descriptions of the tracker's metrics, all labelled by target.
var (
	descBatches   = prometheus.NewDesc("duet_kv_events_batches_total", "KV event batches received, by target (engine and DP rank).", []string{"target"}, nil)
	descEvents    = prometheus.NewDesc("duet_kv_events_total", "KV events received, by target.", []string{"target"}, nil)
	descGaps      = prometheus.NewDesc("duet_kv_events_gaps_total", "Sequence gaps seen, by target (replayed or not).", []string{"target"}, nil)
	descReplayed  = prometheus.NewDesc("duet_kv_events_replayed_total", "Batches recovered from the engine's replay socket, by target.", []string{"target"}, nil)
	descResets    = prometheus.NewDesc("duet_kv_events_resets_total", "Times a target's view started over (subscription, publisher restart, unreplayable gap, garbage), by target.", []string{"target"}, nil)
	descMalformed = prometheus.NewDesc("duet_kv_events_malformed_total", "Messages that were not KV event batches, by target.", []string{"target"}, nil)
	descLag       = prometheus.NewDesc("duet_kv_events_lag_seconds", "Time since the engine stamped the last batch received, by target (absent before the first).", []string{"target"}, nil)
	descBlocks    = prometheus.NewDesc("duet_kv_events_blocks", "Prefix blocks the target's cache holds according to its events.", []string{"target"}, nil)
	descState     = prometheus.NewDesc("duet_kv_events_state", "The target's view: 0 fallback (the prefix estimate is used), 1 warming (the larger of view and estimate), 2 live.", []string{"target"}, nil)
	descFallbacks = prometheus.NewDesc("duet_kv_events_fallbacks_total", "Times the target fell back to the prefix estimate, by reason (unreachable, lag).", []string{"target", "reason"}, nil)
)

// Collector returns a collector of the tracker's metrics, for a pool's
// registerer.
func (t *Tracker[K]) Collector() prometheus.Collector { return trackerCollector[K]{t: t} }

// Describe implements prometheus.Collector.
func (trackerCollector[K]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBatches, descEvents, descGaps, descReplayed, descResets, descMalformed, descLag, descBlocks, descState, descFallbacks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c trackerCollector[K]) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.t.Status() {
		name := st.Name
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), name)
		}
		counter(descBatches, st.Stats.Batches)
		counter(descEvents, st.Stats.Events)
		counter(descGaps, st.Stats.Gaps)
		counter(descReplayed, st.Stats.Replayed)
		counter(descResets, st.Stats.Resets)
		counter(descMalformed, st.Stats.Malformed)
		if !st.LastBatch.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, st.Lag.Seconds(), name)
		}
		ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(st.Blocks), name)
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, float64(st.State), name)
		for reason, n := range st.Fallbacks {
			ch <- prometheus.MustNewConstMetric(descFallbacks, prometheus.CounterValue, float64(n), name, reason)
		}
	}
}
