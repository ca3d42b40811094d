package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// This file holds what differs in the vLLM flavour (Config.Flavor vllm):
// aggregated serving with internal DP load balancing, the rank pinned by
// the X-data-parallel-rank header, vLLM's error shape and vllm: metrics.

// parseOptions returns how requests are parsed on this server.
func (s *Server) parseOptions() parseOptions {
	o := parseOptions{vllm: s.cfg.Flavor == FlavorVLLM}
	if s.prof != nil {
		o.blockTokens = s.prof.BlockSize
		o.tok = s.tok
	}
	return o
}

// explicitRank resolves the rank a request pins, per flavour.
func (s *Server) explicitRank(route routeKind, h http.Header, bodyRank *int) (*pinnedRank, *apiError) {
	if s.cfg.Flavor == FlavorVLLM {
		return explicitRankVLLM(route, h, s.cfg.DPSize)
	}
	return explicitRank(route, h, bodyRank, s.cfg.DPSize)
}

// explicitRankVLLM resolves the rank like vLLM's _get_data_parallel_rank:
// only the X-data-parallel-rank header (case-insensitive) on chat and
// completions; a non-integer value is ignored; a rank outside [0, dp) is
// the engine's ValueError, a 400.
func explicitRankVLLM(route routeKind, h http.Header, dpSize int) (*pinnedRank, *apiError) {
	if route != routeChat && route != routeCompletions {
		return nil, nil
	}
	vals := h.Values(dpRankHeader)
	if len(vals) == 0 {
		return nil, nil
	}
	r, err := strconv.Atoi(strings.TrimSpace(vals[0]))
	if err != nil {
		return nil, nil
	}
	if r < 0 || r >= dpSize {
		return nil, badRequestf("data_parallel_rank %d is out of range [0, %d).", r, dpSize)
	}
	return &pinnedRank{rank: r, source: sourceHeader}, nil
}

// leastLoadedRank is vLLM's internal DP load balancing: the engine with
// the lowest waiting·4 + running, the lowest index on ties.
func (s *Server) leastLoadedRank() int {
	best, bestScore := 0, -1
	for _, l := range s.snapshot() {
		score := l.waiting*4 + l.running
		if bestScore < 0 || score < bestScore {
			best, bestScore = l.dpRank, score
		}
	}
	return best
}

// errorBody renders err the way the flavour does on route.
func (s *Server) errorBody(route routeKind, err *apiError) []byte {
	if s.cfg.Flavor == FlavorVLLM {
		return vllmErrorBody(err)
	}
	return errorBody(route, err)
}

// streamErrorBody renders an in-stream error the way the flavour does.
func (s *Server) streamErrorBody(err *apiError) []byte {
	if s.cfg.Flavor == FlavorVLLM {
		return vllmErrorBody(err)
	}
	return streamErrorBody(err)
}

// vllmErrorBody is vLLM's ErrorResponse: {"error": {message, type, param,
// code}}.
func vllmErrorBody(err *apiError) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": err.msg,
		"type":    openAIErrorType(err.status),
		"param":   nil,
		"code":    err.status,
	}})
	return b
}

// vllmHandler builds the vLLM flavour's HTTP API.
func (s *Server) vllmHandler() (http.Handler, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(newVLLMCollector(s)); err != nil {
		return nil, fmt.Errorf("register vllm collector: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		// vLLM's /health only checks that the engine process is alive.
		if s.draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": VLLMVersion})
	})
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.Handle("GET /metrics", s.scrapeFaults(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	for _, route := range []routeKind{routeChat, routeCompletions, routeResponses} {
		mux.HandleFunc("POST "+route.path(), s.inferHandler(route))
	}
	s.addCommonRoutes(mux)
	return mux, nil
}

// vllmMetric is one per-engine vLLM series and how to read it.
type vllmMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(l rankSnapshot) float64
}

// vllmCollector exports vLLM's per-engine metrics, labelled engine and
// model_name. Counters are named with _total, the name vLLM's Python
// prometheus_client exposes for its Counter "vllm:prefix_cache_queries".
type vllmCollector struct {
	s       *Server
	metrics []vllmMetric
}

// newVLLMCollector builds the collector for s.
func newVLLMCollector(s *Server) *vllmCollector {
	labels := []string{"engine", "model_name"}
	m := func(name, help string, typ prometheus.ValueType, f func(rankSnapshot) float64) vllmMetric {
		return vllmMetric{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, value: f}
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	return &vllmCollector{s: s, metrics: []vllmMetric{
		m("vllm:num_requests_running", "Number of requests in model execution batches.", gauge,
			func(l rankSnapshot) float64 { return float64(l.running) }),
		m("vllm:num_requests_waiting", "Number of requests waiting to be processed.", gauge,
			func(l rankSnapshot) float64 { return float64(l.waiting) }),
		m("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", gauge,
			func(l rankSnapshot) float64 { return float64(l.usedTokens) / float64(s.cfg.MaxTotalTokens) }),
		m("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", counter,
			func(l rankSnapshot) float64 { return float64(l.prefixQueries) }),
		m("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", counter,
			func(l rankSnapshot) float64 { return float64(l.prefixHits) }),
		m("vllm:prompt_tokens_total", "Number of prefill tokens processed.", counter,
			func(l rankSnapshot) float64 { return float64(l.promptTotal) }),
		m("vllm:generation_tokens_total", "Number of generation tokens processed.", counter,
			func(l rankSnapshot) float64 { return float64(l.genTotal) }),
	}}
}

// Describe implements prometheus.Collector.
func (c *vllmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector.
func (c *vllmCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.s.snapshot() {
		for _, m := range c.metrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(l), strconv.Itoa(l.dpRank), c.s.cfg.Model)
		}
	}
}
