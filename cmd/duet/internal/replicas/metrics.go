package replicas

import "github.com/prometheus/client_golang/prometheus"

// metrics are a Replicas' Prometheus metrics.
type metrics struct {
	connected prometheus.Gauge
	events    *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	lag       prometheus.Histogram
}

func newMetrics() metrics {
	return metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "duet_sync_connected",
			Help: "1 while this replica is connected to NATS and shares state with its peers, 0 while it routes alone.",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_sync_events_total",
			Help: "Events shared with the other replicas, by kind (routed: a request's route with its pick; picked: a pick sent alone because its route never followed; leg; hello; outbox) and direction (sent, received).",
		}, []string{"kind", "direction"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_sync_events_dropped_total",
			Help: "Events lost between replicas, by kind and reason: publish (NATS away past the reconnect buffer), slow_consumer (this replica fell behind), malformed.",
		}, []string{"kind", "reason"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "duet_sync_lag_seconds",
			Help:    "Delay of the peers' events, from the sender's clock at publishing to this replica's at receipt (clock skew between hosts included).",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
		}),
	}
}

// register registers the metrics and a gauge of r's live peers with reg.
func (m metrics) register(reg prometheus.Registerer, r *Replicas) {
	peers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "duet_sync_peers",
		Help: "Other replicas heard from within three heartbeats.",
	}, func() float64 {
		n := 0
		for _, p := range r.Peers() {
			if p.Alive {
				n++
			}
		}
		return float64(n)
	})
	reg.MustRegister(m.connected, m.events, m.dropped, m.lag, peers)
}
