package sim

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricLabels are the labels of every per-rank gauge, as SGLang's
// SchedulerMetricsCollector sets them. SGLang adds dp_rank only when the
// scheduler was launched by the DP controller, i.e. dp_size > 1.
func metricLabels(dpSize int) []string {
	labels := []string{"engine_type", "model_name", "pp_rank", "tp_rank"}
	if dpSize > 1 {
		labels = append([]string{"dp_rank"}, labels...)
	}
	return labels
}

// gaugeSpec is one per-rank gauge (or counter) and how to read it from a
// snapshot.
type gaugeSpec struct {
	desc  *prometheus.Desc
	value func(s *Server, l rankSnapshot) float64
	// counter exports it as a counter instead of a gauge.
	counter bool
}

// rankCollector exports the live per-rank load on every scrape.
type rankCollector struct {
	s      *Server
	gauges []gaugeSpec
}

// newRankCollector builds the collector for s.
func newRankCollector(s *Server) *rankCollector {
	labels := metricLabels(s.cfg.DPSize)
	g := func(name, help string, f func(*Server, rankSnapshot) float64) gaugeSpec {
		return gaugeSpec{desc: prometheus.NewDesc(name, help, labels, nil), value: f}
	}
	usage := func(s *Server, l rankSnapshot) float64 {
		return float64(l.usedTokens) / float64(s.cfg.MaxTotalTokens)
	}
	return &rankCollector{s: s, gauges: []gaugeSpec{
		g("sglang:num_running_reqs", "The number of running requests.",
			func(_ *Server, l rankSnapshot) float64 { return float64(l.running) }),
		g("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
			func(_ *Server, l rankSnapshot) float64 { return float64(l.waiting) }),
		g("sglang:num_used_tokens", "The number of used tokens.",
			func(_ *Server, l rankSnapshot) float64 { return float64(l.usedTokens) }),
		g("sglang:token_usage", "The token usage.", usage),
		g("sglang:cache_hit_rate", "The cache hit rate.",
			func(_ *Server, l rankSnapshot) float64 { return l.cacheHitRate }),
		g("sglang:gen_throughput", "The generation throughput (token/s).",
			func(_ *Server, l rankSnapshot) float64 { return l.genThroughput }),
		// SGLang 0.5.23's PD queue gauges (metrics_collector.py
		// SchedulerMetricsCollector), each in every mode: a queue of the
		// other mode, or of an aggregated server, is 0. It has no gauge for
		// the decode's retracted queue.
		g("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.",
			pdGauge(func(q pdQueues) int { return q.prefillBootstrap })),
		g("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.",
			pdGauge(func(q pdQueues) int { return q.prefillInflight })),
		g("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.",
			pdGauge(func(q pdQueues) int { return q.decodePrealloc })),
		g("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.",
			pdGauge(func(q pdQueues) int { return q.decodeTransfer })),
		{desc: prometheus.NewDesc("sglang:num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests.", labels, nil),
			counter: true, value: func(s *Server, l rankSnapshot) float64 { return float64(s.bootstrapFailures(l.dpRank)) }},
	}}
}

// pdGauge reads one PD queue's size from a rank's snapshot.
func pdGauge(size func(pdQueues) int) func(*Server, rankSnapshot) float64 {
	return func(s *Server, l rankSnapshot) float64 {
		return float64(size(rankPDQueues(s.cfg.Mode, l)))
	}
}

// Describe implements prometheus.Collector.
func (c *rankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.gauges {
		ch <- g.desc
	}
}

// Collect implements prometheus.Collector.
func (c *rankCollector) Collect(ch chan<- prometheus.Metric) {
	engine := c.s.cfg.Mode.engineType()
	for _, l := range c.s.snapshot() {
		labels := []string{engine, c.s.cfg.Model, "0", "0"}
		if c.s.cfg.DPSize > 1 {
			labels = append([]string{strconv.Itoa(l.dpRank)}, labels...)
		}
		for _, g := range c.gauges {
			vt := prometheus.GaugeValue
			if g.counter {
				vt = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(g.desc, vt, g.value(c.s, l), labels...)
		}
	}
}

// tokenTotals are SGLang's tokenizer-level counters: prompt, cached-prompt
// and generated tokens of finished requests (no dp_rank label, as in SGLang).
// On a PD prefill server, cached/prompt is the prefix cache's hit rate.
type tokenTotals struct {
	prompt, cached, generated atomic.Int64
}

// add counts one finished item.
func (t *tokenTotals) add(res itemResult) {
	t.prompt.Add(int64(res.promptTokens))
	t.cached.Add(int64(res.cachedTokens))
	t.generated.Add(int64(res.completionTokens))
}

var (
	promptTokensDesc = prometheus.NewDesc("sglang:prompt_tokens_total", "Number of prefill tokens processed.", []string{"model_name"}, nil)
	cachedTokensDesc = prometheus.NewDesc("sglang:cached_tokens_total", "Number of cached prompt tokens.", []string{"model_name"}, nil)
	genTokensDesc    = prometheus.NewDesc("sglang:generation_tokens_total", "Number of generation tokens processed.", []string{"model_name"}, nil)
	abortedDesc      = prometheus.NewDesc("sglang:num_aborted_requests_total",
		"Number of requests aborted (by /abort_request).", []string{"model_name"}, nil)
)

// tokenCollector exports tokenTotals.
type tokenCollector struct{ s *Server }

// Describe implements prometheus.Collector.
func (c tokenCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- promptTokensDesc
	ch <- cachedTokensDesc
	ch <- genTokensDesc
	ch <- abortedDesc
}

// Collect implements prometheus.Collector.
func (c tokenCollector) Collect(ch chan<- prometheus.Metric) {
	t, model := &c.s.totals, c.s.cfg.Model
	ch <- prometheus.MustNewConstMetric(promptTokensDesc, prometheus.CounterValue, float64(t.prompt.Load()), model)
	ch <- prometheus.MustNewConstMetric(cachedTokensDesc, prometheus.CounterValue, float64(t.cached.Load()), model)
	ch <- prometheus.MustNewConstMetric(genTokensDesc, prometheus.CounterValue, float64(t.generated.Load()), model)
	ch <- prometheus.MustNewConstMetric(abortedDesc, prometheus.CounterValue, float64(c.s.inflight.aborted.Load()), model)
}

// metricsHandler serves /metrics from a private registry.
func (s *Server) metricsHandler() (http.Handler, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(newRankCollector(s)); err != nil {
		return nil, fmt.Errorf("register rank collector: %w", err)
	}
	if err := reg.Register(tokenCollector{s: s}); err != nil {
		return nil, fmt.Errorf("register token collector: %w", err)
	}
	if err := reg.Register(s.stageHist.vec); err != nil {
		return nil, fmt.Errorf("register per-stage latency histogram: %w", err)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
