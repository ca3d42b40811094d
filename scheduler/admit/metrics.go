package admit

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxTenantLabels bounds the distinct tenant label values: tenants come
// from requests, and each value is a time series. Later ones are "other".
const maxTenantLabels = 100

// Metrics is an Observer that records Prometheus metrics.
type Metrics struct {
	requests *prometheus.CounterVec
	wait     *prometheus.HistogramVec

	mu      sync.Mutex
	tenants map[string]bool
}

// NewMetrics registers the admission metrics on reg (which may add a pool
// label) and returns them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_admission_requests_total",
			Help: "Requests through admission, by class, tenant and outcome: admitted (at once), queued_admitted (after waiting), left (the client went away while queued), queue_full, wait_limit, shed (for a higher class), closed, proxy_timeout (Envoy stopped waiting for duet's answer while the request was queued: its ext_proc message timeout).",
		}, []string{"class", "tenant", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "duet_admission_wait_seconds",
			Help:    "Time queued requests waited, by class and outcome (admitted, refused, left).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"class", "outcome"}),
		tenants: map[string]bool{},
	}
	for _, c := range []prometheus.Collector{m.requests, m.wait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// tenant bounds the tenant label's values.
func (m *Metrics) tenant(t string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tenants[t] {
		return t
	}
	if len(m.tenants) >= maxTenantLabels {
		return "other"
	}
	m.tenants[t] = true
	return t
}

// Admitted implements Observer.
func (m *Metrics) Admitted(class, tenant string, waited time.Duration) {
	if waited == 0 {
		m.requests.WithLabelValues(class, m.tenant(tenant), "admitted").Inc()
		return
	}
	m.requests.WithLabelValues(class, m.tenant(tenant), "queued_admitted").Inc()
	m.wait.WithLabelValues(class, "admitted").Observe(waited.Seconds())
}

// Refused implements Observer.
func (m *Metrics) Refused(class, tenant string, reason error, waited time.Duration) {
	m.requests.WithLabelValues(class, m.tenant(tenant), Outcome(reason)).Inc()
	if waited > 0 {
		m.wait.WithLabelValues(class, "refused").Observe(waited.Seconds())
	}
}

// Left implements Observer.
func (m *Metrics) Left(class, tenant string, waited time.Duration) {
	m.requests.WithLabelValues(class, m.tenant(tenant), "left").Inc()
	m.wait.WithLabelValues(class, "left").Observe(waited.Seconds())
}

// Outcome is a refusal reason's label: queue_full, wait_limit, shed,
// closed, proxy_timeout.
func Outcome(reason error) string {
	switch {
	case errors.Is(reason, ErrQueueFull):
		return "queue_full"
	case errors.Is(reason, ErrWaitLimit):
		return "wait_limit"
	case errors.Is(reason, ErrShed):
		return "shed"
	case errors.Is(reason, ErrClosed):
		return "closed"
	case errors.Is(reason, ErrProxyTimeout):
		return "proxy_timeout"
	}
	return "error"
}

// Descriptions of an Admitter's gauges.
var (
	descQueued       = prometheus.NewDesc("duet_admission_queued", "Requests waiting in duet's admission queue, by class.", []string{"class"}, nil)
	descQueuedTokens = prometheus.NewDesc("duet_admission_queued_tokens", "Tokens of the requests waiting in duet's admission queue.", nil, nil)
	descDrain        = prometheus.NewDesc("duet_admission_drain_tokens_per_second", "Tokens per second let through while requests were queued, over the last seconds (0: unknown).", nil, nil)
)

// admitterCollector exports an Admitter's queue at scrape time.
type admitterCollector struct{ a *Admitter }

// Collector returns a collector of the Admitter's queue gauges.
func (a *Admitter) Collector() prometheus.Collector { return admitterCollector{a} }

// Describe implements prometheus.Collector.
func (admitterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descQueued
	ch <- descQueuedTokens
	ch <- descDrain
}

// Collect implements prometheus.Collector.
func (c admitterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.a.Snapshot()
	for class, n := range s.ByClass {
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(n), class)
	}
	ch <- prometheus.MustNewConstMetric(descQueuedTokens, prometheus.GaugeValue, float64(s.QueuedTokens))
	ch <- prometheus.MustNewConstMetric(descDrain, prometheus.GaugeValue, s.DrainRate)
}
