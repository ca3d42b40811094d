package extproc

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the ext_proc stream's Prometheus metrics.
type Metrics struct {
	requests        *prometheus.CounterVec
	latency         *prometheus.HistogramVec
	tokenize        *prometheus.CounterVec
	tokenizeSeconds *prometheus.HistogramVec
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
		tokenize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_tokenize_requests_total",
			Help: "Requests of pools with a tokenizer, by pool and outcome: ok (token ids from the chat template and tokenizer), input_ids (the client sent ids), template_fallback (the chat template failed; routed by the text estimate), invalid_messages (answered 400), unsupported_route (/v1/responses, routed by the text estimate).",
		}, []string{"pool", "outcome"}),
		tokenizeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "duet_tokenize_seconds",
			Help:    "Time to render and tokenize a request's prompt, by pool.",
			Buckets: prometheus.ExponentialBuckets(0.000005, 3, 10),
		}, []string{"pool"}),
	}
	reg.MustRegister(m.requests, m.latency, m.tokenize, m.tokenizeSeconds)
	return m
}
