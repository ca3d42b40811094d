package extproc

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the ext_proc stream's Prometheus metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_extproc_requests_total",
			Help: "Requests seen on the ext_proc stream, by route, pool (empty for requests answered before a pool was chosen) and outcome.",
		}, []string{"route", "pool", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "duet_extproc_decision_seconds",
			Help:    "Time from the message that completes a request to duet's answer (parse, pick, rewrite).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.latency)
	return m
}
