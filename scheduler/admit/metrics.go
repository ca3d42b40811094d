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
			Help: "Requests through admission, by class, tenant and outcome: admitted (at once), queued_admitted (after waiting), left (the client went away while queued), queue_full, wait_limit, shed (for a higher class), closed.",
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

// Queued implements Observer.
func (m *Metrics) Queued(class, tenant string) {}

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
// closed.
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
	}
	return "error"
}
