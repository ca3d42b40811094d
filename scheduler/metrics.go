package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scheduler's Prometheus metrics.
type metrics struct {
	picks        *prometheus.CounterVec
	pickSeconds  prometheus.Histogram
	scrapeErrors *prometheus.CounterVec
	failures     *prometheus.CounterVec
	feedback     *prometheus.CounterVec
	policies     map[Role]string

	endpointEjected *prometheus.GaugeVec
	targetEjected   *prometheus.GaugeVec
	ejections       *prometheus.CounterVec
	probes          *prometheus.CounterVec
	recoveries      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, l *ledger, policies map[Role]string) *metrics {
	m := &metrics{
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_picks_total",
			Help: "Targets chosen, by role, policy and target (endpoint/dp rank).",
		}, []string{"role", "policy", "target"}),
		pickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "duet_pick_duration_seconds",
			Help:    "Time to choose and reserve the targets of one request.",
			Buckets: prometheus.ExponentialBuckets(0.000001, 4, 12),
		}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_load_scrape_errors_total",
			Help: "Failed load scrapes, by role and endpoint.",
		}, []string{"role", "endpoint"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_target_failures_total",
			Help: "Legs that failed according to completion feedback, by role and target.",
		}, []string{"role", "target"}),
		feedback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_feedback_total",
			Help: "Completion feedback received, by leg and outcome: released (it ended reservations), already_released (the whole request's entry had ended them first), unknown_request (a request the ledger never held or has forgotten).",
		}, []string{"leg", "outcome"}),
		policies: policies,
		endpointEjected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "duet_endpoint_ejected",
			Help: "1 while the endpoint is ejected or half-open (from its ejection to its recovery), else 0; by role and endpoint.",
		}, []string{"role", "endpoint"}),
		targetEjected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "duet_target_ejected",
			Help: "1 while the target is ejected or half-open (from its ejection to its recovery), else 0; by role and target. Absent until the target's first ejection.",
		}, []string{"role", "target"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_ejections_total",
			Help: "Ejections of endpoints (reason unreachable, scrape, probe) and of targets (reason failures), by role, endpoint and reason.",
		}, []string{"role", "endpoint", "reason"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_health_probes_total",
			Help: "Active health probes, by role, endpoint and outcome (ok, failed).",
		}, []string{"role", "endpoint", "outcome"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_health_recoveries_total",
			Help: "Ejected endpoints and targets that recovered from half-open, by role and endpoint.",
		}, []string{"role", "endpoint"}),
	}
	reg.MustRegister(m.picks, m.pickSeconds, m.scrapeErrors, m.failures, m.feedback, &ledgerCollector{l: l},
		m.endpointEjected, m.targetEjected, m.ejections, m.probes, m.recoveries)
	return m
}

// Descriptions of the saturation gauges.
var (
	saturatedDesc = prometheus.NewDesc("duet_saturated_targets",
		"Targets that are saturated (SaturationConfig), by role; the pool queues requests in duet while all of a role's schedulable targets are.",
		[]string{"role"}, nil)
	schedulableDesc = prometheus.NewDesc("duet_targets_schedulable",
		"Targets picks may choose (not ejected), by role.", []string{"role"}, nil)
)

// saturationCollector reports each role's saturation at scrape time.
type saturationCollector struct{ s *Scheduler }

// Describe implements prometheus.Collector.
func (saturationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- saturatedDesc
	ch <- schedulableDesc
}

// Collect implements prometheus.Collector.
func (c saturationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.s.Saturation() {
		ch <- prometheus.MustNewConstMetric(saturatedDesc, prometheus.GaugeValue, float64(r.Saturated), string(r.Role))
		ch <- prometheus.MustNewConstMetric(schedulableDesc, prometheus.GaugeValue, float64(r.Targets), string(r.Role))
	}
}

// picksFor returns the pick counter of one target.
func (m *metrics) picksFor(role Role, target string) prometheus.Counter {
	return m.picks.WithLabelValues(string(role), m.policies[role], target)
}

var (
	tokensDesc = prometheus.NewDesc("duet_target_tokens",
		"Token load per target as duet sees it: kind=scraped (last fresh engine report) or reserved (duet's reservations not yet covered by a scrape).",
		[]string{"role", "target", "kind"}, nil)
	ageDesc = prometheus.NewDesc("duet_target_load_age_seconds",
		"Age of the target's last successful load scrape (absent until one succeeds).",
		[]string{"role", "target"}, nil)
	reservationsDesc = prometheus.NewDesc("duet_reservations",
		"Requests with reservations or a recently finished record in the ledger.", nil, nil)
)

// ledgerCollector reports the ledger's per-target numbers at scrape time.
type ledgerCollector struct{ l *ledger }

// Describe implements prometheus.Collector.
func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tokensDesc
	ch <- ageDesc
	ch <- reservationsDesc
}

// Collect implements prometheus.Collector.
func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.l
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ts := range l.targets {
		if ts.label == "" {
			continue
		}
		ld := l.load(ts, now)
		role := string(ts.role)
		ch <- prometheus.MustNewConstMetric(tokensDesc, prometheus.GaugeValue, float64(ld.Tokens-ld.Reserved), role, ts.label, "scraped")
		ch <- prometheus.MustNewConstMetric(tokensDesc, prometheus.GaugeValue, float64(ld.Reserved), role, ts.label, "reserved")
		if ts.scrapedAt != 0 {
			age := now.Sub(time.Unix(0, ts.scrapedAt))
			ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, age.Seconds(), role, ts.label)
		}
	}
	ch <- prometheus.MustNewConstMetric(reservationsDesc, prometheus.GaugeValue, float64(len(l.requests)))
}
